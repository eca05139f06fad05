"""The calibration core every hardware family shares: published results -> fit -> refit over the assumptions'
corners -> leave-one-out -> evidence -> widened ranges -> the printed tables.

A family subclasses `Calibration` with what is its own: its in-sample results (`Published`, with its own layout
type), its fit, its assumptions, how it projects a published layout and the columns its tables lead with. The core
does the rest, once per process: the fit on the in-sample systems, each left out in turn and projected by the fit on
the others, the evidence their errors give every projection, each left-out system's range (widened by the other
systems' errors only), the constants table, the in-sample and leave-one-out tables and the JSON line.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, cached_property, partial
from typing import ClassVar, Generic, TypeVar, cast

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from configs.device.base import DeviceConfig
from configs.schema import register
from projection.run import Schedule
from projection.uncertainty import (
    COVERAGE,
    FIXED,
    Assumption,
    C,
    Evidence,
    Interval,
    P,
    Refit,
    column,
    corners,
    describe,
    figures,
    interval,
    prediction_half_width,
    widened,
)

L = TypeVar("L")  # a family's layout of a run over its system
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


@dataclass(frozen=True)
class Published(Generic[L]):
    """One in-sample published result: the results folder, the configs/device/ system it ran on, the layout and
    schedule behind it, and what its five logs time (medians over the runs)."""

    system: str  # the results folder
    device: str  # configs/device/<device>.yaml
    layout: L
    schedule: Schedule  # the epochs it trained and where it evaluated
    throughput_img_s: float  # MLPerf's, as the results give it
    time_to_train_min: float  # the olympic mean
    steady_epoch_s: float = math.nan  # logs: an epoch past the warm-up and the checkpoints (nan: not timed apart)
    evaluation_s: float = math.nan  # logs: an evaluation after the first (nan: not timed apart)


@dataclass(frozen=True)
class LeftOut(Generic[C, P, L]):
    """An in-sample system projected by the constants fitted to the others, its own results unseen: what the model
    says of a system it was not fitted to. Its range over the assumptions, each corner refitted on the others, is
    built only where it is shown (the evidence needs the errors alone)."""

    published: Published[L]
    at: Callable[[C], P]  # the system's layout and schedule, projected under given constants
    central: C
    refit: Refit[C]
    assumptions: Mapping[str, Assumption]

    @cached_property
    def projection(self) -> P:
        return self.at(self.central)

    @cached_property
    def spread(self) -> Interval[P]:
        return interval(self.at, self.refit, self.central, self.assumptions)

    @property
    def throughput_error_pct(self) -> float:
        return error(self.projection.throughput_img_s, self.published.throughput_img_s)

    @property
    def time_to_train_error_pct(self) -> float:
        return error(self.projection.time_to_train_min, self.published.time_to_train_min)


def evidence_of(results: Sequence[LeftOut[C, P, L]], source: str) -> Evidence:
    """The half-widths that hold COVERAGE of the model's error on one more system, from these leave-one-out errors."""
    return Evidence(
        prediction_half_width([result.throughput_error_pct for result in results]),
        prediction_half_width([result.time_to_train_error_pct for result in results]),
        source,
    )


@dataclass(frozen=True)
class Columns:
    """The widths of a family's table columns: its figures differ in size (a GPU cluster's millions of img/s)."""

    rate: int  # the projected img/s
    rates: int  # its range
    minutes: int  # the time to train's range
    missed: str  # leave-one-out's mark where the published figure lies outside its range


class Calibration(ABC, Generic[C, P, L]):
    """A family's calibration on its in-sample results, computed once per process (a family holds one instance).

    A family gives its in-sample results, its fitted constants (with the systems that constrain each), its
    assumptions, the words and columns of its tables, and `assumed`, `fit`, `project_published`, `lead` and
    `left_out_summary`; it may refine `refitter` and `centred`."""

    in_sample: ClassVar[tuple[Published, ...]]  # type: ignore[type-arg]  # a ClassVar cannot take L
    fitted: ClassVar[Mapping[str, str]]  # each fitted constant and the systems that constrain it
    assumptions: ClassVar[Mapping[str, Assumption]]
    fitted_on: ClassVar[str]  # the constants table's first line: what the constants are fitted on
    evidence_source: ClassVar[str]  # the evidence's name in a projection's ranges
    columns: ClassVar[Columns]
    left_out_title: ClassVar[str]  # the line above the leave-one-out table
    what_throughput_is: ClassVar[str]  # under the tables: "(throughput is MLPerf's<this>)"

    @abstractmethod
    def assumed(self) -> C:
        """The constants at the assumptions' central values, before any fit."""

    @abstractmethod
    def fit(self, assumed: C, systems: Sequence[Published[L]]) -> C | None:
        """`assumed` with the fitted constants fitted to `systems`; None where no physical fit exists."""

    @abstractmethod
    def project_published(self, published: Published[L], constants: C) -> P:
        """The projection of a published run's layout and schedule."""

    @abstractmethod
    def lead(self, published: Published[L] | None, left_out: bool) -> str:
        """A table row's first columns (their headings for None): the in-sample table's, or leave-one-out's."""

    @abstractmethod
    def left_out_summary(self, systems: dict[str, object], spreads: Sequence[Interval[P]]) -> dict[str, object]:
        """Print, under the leave-one-out table, what its errors give every projection; the table's JSON, from each
        left-out system's (`systems`)."""

    def refitter(self, systems: Sequence[Published[L]]) -> Refit[C]:
        """`fit` to `systems` for any assumed constants, each set fitted once: every range refits the same corners."""
        return cast(Refit[C], cache(partial(self.fit, systems=systems)))  # a family's constants are frozen

    def centred(self, central: C, systems: Sequence[Published[L]]) -> C:
        """The central fit to `systems`, with whatever is fitted at the centre alone."""
        return central

    def trailing(self, published: Published[L] | None, projection: P | None) -> str:
        """The in-sample table's last columns, after the time to train (their heading for None)."""
        return ""

    def left_out_figures(self, published: Published[L]) -> dict[str, object]:
        """A left-out system's entries in the JSON beyond its figures."""
        return {}

    def fitted_to(self, systems: Sequence[Published[L]]) -> tuple[C, Refit[C]]:
        """The constants fitted to `systems` at the assumptions' central values, and the refit its ranges repeat."""
        refit = self.refitter(systems)
        central = refit(self.assumed())
        assert central is not None, f"the central constants must fit {', '.join(p.system for p in systems)}"
        return self.centred(central, systems), refit

    @cached_property
    def _in_sample_fit(self) -> tuple[C, Refit[C]]:
        return self.fitted_to(self.in_sample)

    @property
    def central(self) -> C:
        """The constants fitted to the in-sample systems."""
        return self._in_sample_fit[0]

    @property
    def refit(self) -> Refit[C]:
        """The refit on the in-sample systems that every projection's ranges repeat."""
        return self._in_sample_fit[1]

    def ranges(self, at: Callable[[C], P]) -> Interval[P]:
        """The projection `at` and its range over the assumptions, each corner refitted on the in-sample systems."""
        return interval(at, self.refit, self.central, self.assumptions)

    def in_sample_interval(self, published: Published[L]) -> Interval[P]:
        return self.ranges(partial(self.project_published, published))

    def others(self, left_out: Published[L]) -> tuple[Published[L], ...]:
        """The in-sample systems but `left_out`."""
        return tuple(published for published in self.in_sample if published is not left_out)

    def leave_out(self, published: Published[L]) -> LeftOut[C, P, L]:
        """`published` (its layout and schedule) projected from the fit on the others."""
        central, refit = self.fitted_to(self.others(published))
        return LeftOut(published, partial(self.project_published, published), central, refit, self.assumptions)

    @cached_property
    def left_out(self) -> tuple[LeftOut[C, P, L], ...]:
        """Each in-sample system left out in turn."""
        return tuple(self.leave_out(published) for published in self.in_sample)

    @cached_property
    def evidence(self) -> Evidence:
        """How far the model lands from systems it was not fitted to: the half-widths from every leave-one-out error
        (time to train at each system's published epochs), which widen every projection's ranges."""
        return evidence_of(self.left_out, self.evidence_source)

    def left_out_range(self, result: LeftOut[C, P, L]) -> Interval[P]:
        """A left-out system's range: its assumptions' range widened by the half-widths of the other systems'
        leave-one-out errors, so that its own error never sizes its own range."""
        rest = [other for other in self.left_out if other is not result]
        source = f"leave-one-out over {', '.join(other.published.system for other in rest)}"
        return widened(result.spread, evidence_of(rest, source))

    def constants_table(self) -> str:
        return constants_table(self.central, self.refit, self.assumptions, self.fitted, self.fitted_on)


def holds(spread: Interval[P], published: Published[L]) -> tuple[bool, bool]:
    """Whether the published throughput, and time to train, lie in the range."""
    (low, high), (fastest, slowest) = spread.throughput_img_s, spread.time_to_train_min
    return low <= published.throughput_img_s <= high, fastest <= published.time_to_train_min <= slowest


def half_widths(spread: Interval[P]) -> tuple[float, float]:
    """Half the throughput's range, and the time to train's, over its central value."""
    (low, high), (fastest, slowest) = spread.throughput_img_s, spread.time_to_train_min
    central = spread.central
    return (high - low) / 2 / central.throughput_img_s, (slowest - fastest) / 2 / central.time_to_train_min


def header(calibration: Calibration[C, P, L], left_out: bool) -> str:
    columns, inside = calibration.columns, " in" if left_out else ""
    throughput = f"{'img/s':>{columns.rate}} {'range':>{columns.rates}} {'published':>10} {'error':>7}{inside}"
    time_to_train = f"{'TTT min':>8} {'range':>{columns.minutes}} {'published':>10} {'error':>7}{inside}"
    trailing = "" if left_out else calibration.trailing(None, None)
    return f"{calibration.lead(None, left_out)} {throughput} {time_to_train}{trailing}"


def table_row(
    calibration: Calibration[C, P, L], published: Published[L], spread: Interval[P], held: tuple[bool, bool] | None
) -> tuple[str, Compared]:
    """A system's line in a calibration table: its throughput and time to train, each with its range, the published
    figure and the error, and (the leave-one-out table) whether the published figure lies in the range."""
    columns, projection = calibration.columns, spread.central
    row = compared(spread, published.throughput_img_s, published.time_to_train_min)
    inside = ("", "") if held is None else tuple(" yes" if each else columns.missed for each in held)
    trailing = "" if held is not None else calibration.trailing(published, projection)
    line = (
        f"{calibration.lead(published, held is not None)}"
        f" {projection.throughput_img_s:>{columns.rate},.0f} {row.rates:>{columns.rates}}"
        f" {published.throughput_img_s:>10,.0f} {row.throughput_error_pct:>+6.1f}%{inside[0]}"
        f" {projection.time_to_train_min:>8.3f} {row.minutes:>{columns.minutes}}"
        f" {published.time_to_train_min:>10.3f} {row.time_to_train_error_pct:>+6.1f}%{inside[1]}{trailing}"
    )
    return line, row


def print_in_sample(calibration: Calibration[C, P, L]) -> tuple[list[Compared], dict[str, object]]:
    """Each in-sample system's projection with its range beside its published figures; the rows and the JSON."""
    print(header(calibration, left_out=False))
    summary: dict[str, object] = {name: getattr(calibration.central, name) for name in calibration.fitted}
    rows = []
    for published in calibration.in_sample:
        line, row = table_row(calibration, published, calibration.in_sample_interval(published), None)
        print(line)
        rows.append(row)
        summary[published.system] = row.summary
    return rows, summary


def print_leave_one_out(calibration: Calibration[C, P, L]) -> dict[str, object]:
    """Each system projected by the fit on the others, in the range the others' errors size, whether its published
    figures lie in it; then what the errors give every projection. Returns its JSON."""
    print(f"\n{calibration.left_out_title}")
    print(header(calibration, left_out=True))
    summary: dict[str, object] = {}
    spreads = [calibration.left_out_range(result) for result in calibration.left_out]
    for result, spread in zip(calibration.left_out, spreads, strict=True):
        published, held = result.published, holds(spread, result.published)
        line, row = table_row(calibration, published, spread, held)
        print(line)
        errors = {name: row.summary[name] for name in ("throughput_error_pct", "time_to_train_error_pct")}
        own = calibration.left_out_figures(published)
        summary[published.system] = figures(spread) | own | errors | {"inside": list(held)}
    return calibration.left_out_summary(summary, spreads)


def print_calibration(calibration: Calibration[C, P, L]) -> None:
    """The fit, each in-sample system's projection with its range beside its published figures, then each projected
    by the fit on the others (leave-one-out) with the range it would have been given; the JSON line last."""
    print(calibration.constants_table())
    rows, summary = print_in_sample(calibration)
    summary["leave_one_out"] = print_leave_one_out(calibration)
    print_table_end(rows, calibration.what_throughput_is, summary)


def half_width_summary(
    calibration: Calibration[C, P, L], systems: dict[str, object], spreads: Sequence[Interval[P]]
) -> dict[str, object]:
    """Print, under the leave-one-out table, the half-widths from all its errors and the median width of its ranges;
    the table's JSON from each left-out system's (`systems`)."""
    found = calibration.evidence
    throughput, time_to_train = zip(*map(half_widths, spreads), strict=True)
    medians = {"throughput": statistics.median(throughput), "time_to_train": statistics.median(time_to_train)}
    print(
        f"half-widths holding {COVERAGE * 100:.0f} % of a new system's error (Student's t over the"
        f" {len(spreads)} leave-one-out errors, as many degrees of freedom): throughput"
        f" {100 * found.throughput:.1f} %, time to train {100 * found.time_to_train:.1f} %"
    )
    print(
        f"median half-width of the leave-one-out ranges above: throughput {100 * medians['throughput']:.1f} %,"
        f" time to train {100 * medians['time_to_train']:.1f} %"
    )
    return {
        "systems": systems,
        "half_widths": {"throughput": round(found.throughput, 4), "time_to_train": round(found.time_to_train, 4)},
        "median_range_half_widths": {name: round(width, 4) for name, width in medians.items()},
    }
