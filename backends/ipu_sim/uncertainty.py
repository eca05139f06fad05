"""How sure a projection is: each assumed constant of the cost model has a range and the reason for it.

The projection is repeated at every corner of those ranges. Each corner is refitted to the POD16 result first,
so the POD16 fit stays exact at every corner. The interval a projection prints is what the assumptions allow
beyond the one system the model is fitted on. A constant that POD16 does not pin down moves the projection
further the further a run's layout is from POD16's.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from backends.ipu_sim.cost import Constants, Projection


@dataclass(frozen=True)
class Assumption:
    low: float
    high: float
    unit: str  # how to print it: "us", "ms", "%" or "" (as is)
    reason: str


# No published figure pins these down (Graphcore publishes bandwidths, not latencies or program costs): each range
# is what the hardware's structure allows, from the sources named, and docs/ipu_sim.md says how it was chosen.
ASSUMPTIONS: dict[str, Assumption] = {
    "memory_efficiency": Assumption(
        0.25,
        0.8,
        "",
        "Jia et al. 2019 (arXiv:1912.03413): compiled loops reach 1/4 of SRAM peak, assembly 0.99",
    ),
    "collective_latency_s": Assumption(
        3e-6, 20e-6, "us", "a ring step is a Sync-Link sync (sub-us) plus staging through GCL's IO tiles (35 kB each)"
    ),
    "gateway_latency_s": Assumption(
        4e-6, 40e-6, "us", "IPU to gateway over PCIe Gen4 x8, a 100 GbE RoCE hop (and a switch in Bow Pod256), back"
    ),
    "gateway_efficiency": Assumption(
        0.5, 0.95, "%", "RoCE on 100 GbE reaches 90-95 % of line rate; GCL's syncless mode over GW-Links, unmeasured"
    ),
    "sync_s": Assumption(0.3e-6, 5e-6, "us", "Sync-Links carry BSP syncs in hardware; gc-hostsynclatencytest: ~0.3 us"),
    "gateway_sync_s": Assumption(
        4e-6, 40e-6, "us", "a sync spanning POD64s is packetised over GW-Links: a RoCE round trip, not a Sync-Link"
    ),
    "update_overhead_s": Assumption(
        0.3e-3,
        4e-3,
        "ms",
        "LARS runs ~7 compute sets per weight tensor (161), each a sync and exchange of 0.3-3 us",
    ),
    "host_sync_s": Assumption(0.2e-3, 5e-3, "ms", "a host round trip per device_iterations: callbacks, engine run"),
    "loader_img_s_per_core": Assumption(
        400, 1100, "", "bench.loader's per-core rates on a 2.1 GHz Xeon, DALI-like to fused; the EPYC 7742 unmeasured"
    ),
}


@dataclass(frozen=True)
class Interval:
    """The central projection, its range over the assumptions, and the one assumption that moves time-to-train
    most."""

    central: Projection
    throughput_img_s: tuple[float, float]
    time_to_train_min: tuple[float, float]
    most_sensitive: str | None  # None where no assumption moves it (the layout the constants are fitted to)
    sensitive_time_to_train_min: tuple[float, float]  # time-to-train at that assumption's low and high end


Refit = Callable[[Constants], Constants]


def corners(central: Constants, assumptions: Mapping[str, Assumption]) -> Iterator[Constants]:
    """`central` with every combination of the assumptions' low and high ends."""
    names = list(assumptions)
    for ends in itertools.product(*((a.low, a.high) for a in assumptions.values())):
        yield dataclasses.replace(central, **dict(zip(names, ends, strict=True)))


def ends(central: Constants, name: str, assumption: Assumption) -> tuple[Constants, Constants]:
    """`central` with one assumption at its low end, and at its high end."""
    low, high = ({name: end} for end in (assumption.low, assumption.high))
    return dataclasses.replace(central, **low), dataclasses.replace(central, **high)


def interval(
    project_at: Callable[[Constants], Projection],
    refit: Refit,
    central: Constants,
    assumptions: Mapping[str, Assumption] = ASSUMPTIONS,
) -> Interval:
    """The projection at `central` and the range of throughput and time-to-train over the corners (the central
    projection included, so the interval holds it even where the model is not monotonic in a constant)."""
    projections = [project_at(central), *(project_at(refit(corner)) for corner in corners(central, assumptions))]
    throughputs = [p.throughput_img_s for p in projections]
    times = [p.time_to_train_min for p in projections]
    swings: dict[str, tuple[float, float]] = {}
    for name, assumption in assumptions.items():
        low_end, high_end = ends(central, name, assumption)
        swings[name] = (project_at(refit(low_end)).time_to_train_min, project_at(refit(high_end)).time_to_train_min)
    most_sensitive = max(swings, key=lambda name: abs(swings[name][1] - swings[name][0]))
    low, high = swings[most_sensitive]
    moved = abs(high - low) > 1e-3 * high
    return Interval(
        projections[0],
        (min(throughputs), max(throughputs)),
        (min(times), max(times)),
        most_sensitive if moved else None,
        swings[most_sensitive],
    )


def figures(interval: Interval) -> dict[str, object]:
    """The central throughput and time-to-train and their ranges, rounded for a JSON line."""
    central = interval.central
    return {
        "throughput_img_s": round(central.throughput_img_s, 1),
        "throughput_img_s_range": [round(value, 1) for value in interval.throughput_img_s],
        "epoch_s": round(central.epoch_s, 3),
        "time_to_train_min": round(central.time_to_train_min, 3),
        "time_to_train_min_range": [round(value, 3) for value in interval.time_to_train_min],
        "most_sensitive": interval.most_sensitive,
    }


def describe(name: str, assumption: Assumption, value: float) -> str:
    """`name = value (low to high)` in the assumption's unit."""
    scale, unit = {"us": (1e6, " us"), "ms": (1e3, " ms"), "%": (100, " %")}.get(assumption.unit, (1, ""))
    return f"{name} = {scale * value:g}{unit} ({scale * assumption.low:g} to {scale * assumption.high:g}{unit})"


def report(interval: Interval, central: Constants, assumptions: Mapping[str, Assumption] = ASSUMPTIONS) -> str:
    """The ranges, as run.mode=project prints them under the central projection."""
    name, (low, high) = interval.most_sensitive, interval.sensitive_time_to_train_min
    ranges = (
        f"over the assumed ranges: throughput {interval.throughput_img_s[0]:,.0f} to "
        f"{interval.throughput_img_s[1]:,.0f} img/s, time to train {interval.time_to_train_min[0]:.3f} to "
        f"{interval.time_to_train_min[1]:.3f} min"
    )
    if name is None:
        return f"{ranges}\nno assumption moves it: this is the layout the constants are fitted to"
    swing = f"most sensitive to {describe(name, assumptions[name], getattr(central, name))}"
    return f"{ranges}\n{swing}: time to train {low:.3f} to {high:.3f} min alone; {assumptions[name].reason}"
