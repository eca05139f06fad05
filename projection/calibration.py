"""What every hardware family's calibration shares: its device configs composed as a run composes them, the
fitted constants' spread over the assumption corners, the table of constants it prints, and the error it reports
against a published figure."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from configs.device.base import DeviceConfig
from configs.schema import register
from projection.uncertainty import FIXED, Assumption, C, Interval, P, Refit, column, corners, describe, figures

D = TypeVar("D", bound=DeviceConfig)


def device_section(name: str, section: type[D]) -> D:
    """configs/device/<name>.yaml with its chip or GPU, composed by Hydra as a run would: a `section`."""
    register()
    inside_a_run = GlobalHydra.instance().is_initialized()  # run.mode=project: compose on the run's search path
    with contextlib.nullcontext() if inside_a_run else initialize_config_module("configs", version_base="1.3"):
        cfg = compose("config", overrides=[f"device={name}"])
    device = OmegaConf.to_object(cfg.device)
    assert isinstance(device, section), f"device={name} is not a {section.__name__}"
    return device


def error(projected: float, published: float) -> float:
    """Relative error of a projection, in percent."""
    return 100 * (projected / published - 1)


@dataclass(frozen=True)
class Compared:
    """An in-sample projection beside its published figures, as a calibration's table prints it."""

    rates: str  # the throughput range in a narrow column ("fixed" where no assumption moves it)
    minutes: str  # the time-to-train range, likewise
    throughput_error_pct: float
    time_to_train_error_pct: float
    summary: dict[str, object]  # its entry in the calibration's JSON line


def compared(spread: Interval[P], throughput_img_s: float, time_to_train_min: float) -> Compared:
    throughput_error = error(spread.central.throughput_img_s, throughput_img_s)
    ttt_error = error(spread.central.time_to_train_min, time_to_train_min)
    return Compared(
        column(*spread.throughput_img_s, "{:,.0f}".format),
        column(*spread.time_to_train_min, "{:.3f}".format),
        throughput_error,
        ttt_error,
        figures(spread)
        | {"throughput_error_pct": round(throughput_error, 2), "time_to_train_error_pct": round(ttt_error, 2)},
    )


def print_table_end(rows: list[Compared], what_throughput_is: str, summary: dict[str, object]) -> None:
    """Under a calibration's table: what its throughput is, what "fixed" means where a row says it, the JSON."""
    print(f"(throughput is MLPerf's{what_throughput_is})")
    if any("fixed" in (row.rates, row.minutes) for row in rows):
        print(f"({FIXED})")
    print(json.dumps(summary))


def fitted_ranges(
    refit: Refit[C], central: C, assumptions: Mapping[str, Assumption], fitted: Mapping[str, str]
) -> dict[str, tuple[float, float]]:
    """Each fitted constant's spread over the assumption corners the in-sample results allow, and the central fit."""
    fits = [central, *(constants for constants in map(refit, corners(central, assumptions)) if constants is not None)]
    return {name: (min(getattr(f, name) for f in fits), max(getattr(f, name) for f in fits)) for name in fitted}


def constants_table(
    central: C, refit: Refit[C], assumptions: Mapping[str, Assumption], fitted: Mapping[str, str], fitted_on: str
) -> str:
    """The fitted constants with their ranges and the systems that constrain each, then the assumed ones with theirs
    and the reason, as a calibration prints them."""
    lines = [
        f"fitted on {fitted_on},",
        "with the range the assumptions below allow, and the systems that constrain each:",
    ]
    for name, (low, high) in fitted_ranges(refit, central, assumptions, fitted).items():
        lines.append(f"  {name} = {getattr(central, name):.4g} ({low:.4g} to {high:.4g}): {fitted[name]}")
    lines.append("measured in the in-sample logs or assumed, each with the range projections are repeated over:")
    lines += [f"  {describe(name, a, getattr(central, name))}: {a.reason}" for name, a in assumptions.items()]
    return "\n".join(lines) + "\n"
