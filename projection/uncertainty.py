"""How sure a projection is, for any hardware family's model: each assumed constant has a range and the reason
for it (projection/ipu/assumptions.py, projection/gpu/cost.py).

The projection is repeated at every corner of those ranges. Each corner is refitted to the family's in-sample
results first, so they stay matched at every corner, and a corner they leave no physical fit for (an efficiency
above 1, a negative cost) is left out. The interval a projection prints is what the assumptions allow beyond the
systems the model is fitted on: the further a run is from them (more nodes or POD64s, smaller batches per chip,
another chip), the more a constant they do not pin down moves it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class Projected(Protocol):
    """What every family's projection gives: MLPerf's throughput and the time to train."""

    @property
    def throughput_img_s(self) -> float: ...

    @property
    def time_to_train_min(self) -> float: ...

    @property
    def epoch_s(self) -> float: ...


C = TypeVar("C", bound="DataclassInstance")  # a model's constants
P = TypeVar("P", bound=Projected)


@dataclass(frozen=True)
class Assumption:
    low: float
    high: float
    unit: str  # how to print it: "us", "ms", "%", "s" or "" (as is)
    reason: str
    additive: bool = False  # only adds time after the steps (time-to-train rises with it): its two ends bound it


COVERAGE = 0.8  # the share of real outcomes a printed range is sized to hold: "8 in 10"


def prediction_half_width(errors_pct: Sequence[float], coverage: float = COVERAGE) -> float:
    """The half-width (a fraction) that holds `coverage` of the error on one more system, from the model's errors on
    systems it was not fitted to (leave-one-out, in %): Student's t prediction interval, the errors taken as centred
    on zero (the fit is unbiased on its own systems) with their root mean square as the spread, so n errors give n
    degrees of freedom."""
    from scipy import stats  # about a second to import: only a projection pays it, not every train.py start

    rms = math.sqrt(sum(error**2 for error in errors_pct) / len(errors_pct)) / 100
    return float(stats.t.ppf(0.5 + coverage / 2, len(errors_pct))) * rms


@dataclass(frozen=True)
class Evidence:
    """How far a family's model lands from published figures it was not fitted to: each half-width (a fraction) holds
    COVERAGE of the leave-one-out errors (prediction_half_width), `source` says over which systems."""

    throughput: float
    time_to_train: float
    source: str


@dataclass(frozen=True)
class Convergence:
    """How far an MLPerf score moves with the evaluation its five runs stop at: the score's COVERAGE range as
    fractions below and above its central value (projection/convergence.py), and what it rests on."""

    below: float
    above: float
    source: str


NO_SPREAD = Convergence(0.0, 0.0, "no convergence spread")


@dataclass(frozen=True)
class Interval(Generic[P]):
    """The central projection, its range over the assumptions, and the one assumption that moves time-to-train
    most."""

    central: P
    throughput_img_s: tuple[float, float]
    time_to_train_min: tuple[float, float]
    most_sensitive: str | None  # None where no assumption moves it (the layout the constants are fitted to)
    sensitive_time_to_train_min: tuple[float, float]  # time-to-train at that assumption's low and high end
    evidence: Evidence | None = None  # set where widened() sized the ranges to COVERAGE
    convergence: Convergence = NO_SPREAD
    assumed: tuple[tuple[float, float], tuple[float, float]] | None = None  # widened(): the assumptions' ranges


Refit = Callable[[C], C | None]  # None: the in-sample results leave no physical fit


def corners(central: C, assumptions: Mapping[str, Assumption]) -> Iterator[C]:
    """`central` with every combination of the assumptions' low and high ends; the additive ones all at their low
    ends or all at their high ends, which bounds them (time-to-train only rises with each)."""
    joint = {name: a for name, a in assumptions.items() if not a.additive}
    additive = {name: a for name, a in assumptions.items() if a.additive}
    lows, highs = ({name: getattr(a, end) for name, a in additive.items()} for end in ("low", "high"))
    for ends in itertools.product(*((a.low, a.high) for a in joint.values())):
        for extremes in (lows, highs):
            yield dataclasses.replace(central, **dict(zip(joint, ends, strict=True)), **extremes)


def ends(central: C, name: str, assumption: Assumption) -> tuple[C, C]:
    """`central` with one assumption at its low end, and at its high end."""
    low, high = ({name: end} for end in (assumption.low, assumption.high))
    return dataclasses.replace(central, **low), dataclasses.replace(central, **high)


def interval(
    project_at: Callable[[C], P],
    refit: Refit[C],
    central: C,
    assumptions: Mapping[str, Assumption],
) -> Interval[P]:
    """The projection at `central` and the range of throughput and time-to-train over the corners and single ends
    the in-sample results allow (one they leave no physical fit for is left out; the central projection is
    included, so the interval holds it even where the model is not monotonic in a constant)."""
    fitted = (refit(corner) for corner in corners(central, assumptions))
    projections = [project_at(central), *(project_at(constants) for constants in fitted if constants is not None)]
    swings: dict[str, tuple[float, float]] = {}
    for name, assumption in assumptions.items():
        refitted = [refit(end) for end in ends(central, name, assumption)]
        at_ends = [project_at(constants) for constants in refitted if constants is not None]
        projections += at_ends  # an end the results allow where few corners are: it bounds the range too
        times_at_ends = [p.time_to_train_min for p in at_ends] or [projections[0].time_to_train_min]
        swings[name] = (times_at_ends[0], times_at_ends[-1])
    throughputs = [p.throughput_img_s for p in projections]
    times = [p.time_to_train_min for p in projections]
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


def widened(spread: Interval[P], evidence: Evidence) -> Interval[P]:
    """The assumptions' ranges widened to hold COVERAGE of real outcomes: throughput by the model's leave-one-out
    half-width; time to train by that half-width and `spread`'s convergence spread together, in quadrature
    (independent errors, each sized to the same coverage)."""
    convergence = spread.convergence
    low, high = spread.throughput_img_s
    fastest, slowest = spread.time_to_train_min
    below = math.hypot(evidence.time_to_train, convergence.below)
    above = math.hypot(evidence.time_to_train, convergence.above)
    return dataclasses.replace(
        spread,
        throughput_img_s=(low * (1 - evidence.throughput), high * (1 + evidence.throughput)),
        time_to_train_min=(fastest * (1 - below), slowest * (1 + above)),
        evidence=evidence,
        convergence=convergence,
        assumed=(spread.throughput_img_s, spread.time_to_train_min),
    )


def figures(interval: Interval[P]) -> dict[str, object]:
    """The central throughput and time-to-train and their ranges, rounded for a JSON line."""
    central, evidence, convergence = interval.central, interval.evidence, interval.convergence
    return {
        "throughput_img_s": round(central.throughput_img_s, 1),
        "throughput_img_s_range": [round(value, 1) for value in interval.throughput_img_s],
        "epoch_s": round(central.epoch_s, 3),
        "time_to_train_min": round(central.time_to_train_min, 3),
        "time_to_train_min_range": [round(value, 3) for value in interval.time_to_train_min],
        "most_sensitive": interval.most_sensitive,
        "coverage": COVERAGE,
        "model_error_pct": None if evidence is None else [round(100 * e, 2) for e in evidence_pair(evidence)],
        "convergence_pct": [round(-100 * convergence.below, 2) or 0.0, round(100 * convergence.above, 2)],  # not -0.0
    }


def evidence_pair(evidence: Evidence) -> tuple[float, float]:
    return evidence.throughput, evidence.time_to_train


def describe(name: str, assumption: Assumption, value: float) -> str:
    """`name = value (low to high)` in the assumption's unit."""
    scales = {"us": (1e6, " us"), "ms": (1e3, " ms"), "%": (100, " %"), "s": (1, " s")}
    scale, unit = scales.get(assumption.unit, (1, ""))
    return f"{name} = {scale * value:g}{unit} ({scale * assumption.low:g} to {scale * assumption.high:g}{unit})"


NOT_MOVED = "no assumed constant moves it"


def span(low: float, high: float, shown: Callable[[float], str], joined: str = " to ", unmoved: str = NOT_MOVED) -> str:
    """A range as printed ("low to high"; a table's narrow column joins with "-" and says "fixed"), or, where its
    ends print the same (the POD64's throughput, which its steady epochs fix), that no assumption moves the figure:
    said in words, not as a range of zero width."""
    return f"{shown(low)}{joined}{shown(high)}" if shown(low) != shown(high) else unmoved


def unit(spanned: str, name: str) -> str:
    """A span() with its unit after it, where it is a range."""
    return spanned if spanned == NOT_MOVED else f"{spanned} {name}"


def column(low: float, high: float, shown: Callable[[float], str]) -> str:
    """span() in a table's narrow column; the tables say under them what "fixed" means (FIXED)."""
    return span(low, high, shown, "-", "fixed")


FIXED = 'a range "fixed": no assumed constant moves the figure (the steady epochs it was fitted to fix it)'


def headline(interval: Interval[P], epochs: str) -> str:
    """The answer first, in one line a planner reads: the time to train for `epochs` and the throughput, and the
    ranges COVERAGE of real results should land in (widened(): the model's error off its fit, where runs stop, the
    assumed constants)."""
    ttt, rate = interval.central.time_to_train_min, interval.central.throughput_img_s
    (fastest, slowest), (low, high) = interval.time_to_train_min, interval.throughput_img_s
    return (
        f"projected time to train ({epochs}): {ttt:.2f} min at {rate:,.0f} img/s;"
        f" {100 * COVERAGE:.0f} % of real results should land in {fastest:.2f} to {slowest:.2f} min"
        f" and {low:,.0f} to {high:,.0f} img/s"
    )


def report(interval: Interval[P], central: C, assumptions: Mapping[str, Assumption]) -> str:
    """The ranges and what they hold, as run.mode=project prints them under the central projection: the model's
    error off its fit, where runs stop, and the assumed constants, the one that moves time to train most named."""
    rate, ttt = interval.central.throughput_img_s, interval.central.time_to_train_min
    rates = span(*interval.throughput_img_s, "{:,.0f}".format)
    minutes = span(*interval.time_to_train_min, "{:.3f}".format)
    lines = [f"ranges ({100 * COVERAGE:.0f} % of results): throughput {rate:,.0f} img/s ({rates}), time to train"]
    lines[0] += f" {ttt:.3f} min ({minutes})"
    if interval.evidence is not None:
        evidence = interval.evidence
        lines.append(
            f"  the model's error off its fit: +-{100 * evidence.throughput:.1f} % throughput,"
            f" +-{100 * evidence.time_to_train:.1f} % time to train ({evidence.source})"
        )
    convergence = interval.convergence
    if convergence != NO_SPREAD:
        lines.append(
            f"  where five runs stop: -{100 * convergence.below:.1f} to +{100 * convergence.above:.1f} % of time to"
            f" train, as {convergence.source} converge"
        )
    (slowest, fastest), (shortest, longest) = interval.assumed or (
        interval.throughput_img_s,
        interval.time_to_train_min,
    )
    rates, minutes = span(slowest, fastest, "{:,.0f}".format), span(shortest, longest, "{:.3f}".format)
    lines.append(
        f"  the assumed constants alone: throughput {unit(rates, 'img/s')}, time to train {unit(minutes, 'min')}"
    )
    name, (low, high) = interval.most_sensitive, interval.sensitive_time_to_train_min
    if name is None:
        lines.append("no assumption moves it: this is the layout the constants are fitted to")
    else:
        swing = f"most sensitive to {describe(name, assumptions[name], getattr(central, name))}"
        lines.append(f"{swing}: time to train {low:.3f} to {high:.3f} min alone; {assumptions[name].reason}")
    return "\n".join(lines)


def reach(beyond: list[str]) -> str:
    """Where a projection stands against its calibration: within it, or each way it reaches beyond (nothing is
    widened for those beyond the ranges)."""
    return "within the calibrated regime" if not beyond else "beyond the calibrated regime: " + "; ".join(beyond)
