"""When a run stops, and what that does to its MLPerf score.

A ResNet-50 run stops at the first evaluation that reaches 75.9 % top-1, so runs of one recipe stop at different
evaluations, and MLPerf scores five of them by their olympic mean (the fastest and slowest dropped). mlperf-logging
ships the runs behind each reference convergence point (RCP): "Epochs to converge" in
`rcp_checker/training_*/rcps_resnet.json`. Each of those runs is taken as equally likely, so they give the chance
that a run converges by each epoch. Between two RCP batch sizes the checker interpolates the mean and the standard
deviation linearly; the runs are interpolated alike: both neighbours' runs, each standardised by its own RCP's mean
and deviation, pooled (weighted by nearness) and scaled to the interpolated mean and deviation.

A run that converges within epoch e (e need not be whole between RCPs) stops at the first evaluation after it. The
score's distribution is exact: every way five runs can fall on the stops, with its multinomial probability.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import fmean

import numpy as np

from configs.checks import ConfigError
from mlperf_logs import rcp
from projection.run import Schedule
from projection.uncertainty import COVERAGE, Convergence, Interval, P

RUNS = 5  # MLPerf scores ResNet-50 by five runs, the fastest and the slowest dropped


@dataclass(frozen=True)
class Runs:
    """The epochs reference runs converged in (possibly interpolated between RCPs), each run equally likely within
    its RCP (`weights` sum to 1), and how they were found."""

    epochs: tuple[float, ...]
    weights: tuple[float, ...]
    source: str


def reference_runs(global_batch: int) -> Runs:
    """The RCP runs for `global_batch`, found as mlperf-logging's RCP checker finds its RCP: the RCP at that batch,
    the two either side interpolated, or below the smallest the smallest's. Refused above the largest: no reference
    says how many epochs a run there takes."""
    reference = rcp.reference_for(global_batch)
    if reference.record is None:
        raise ConfigError(
            "run.max_epochs",
            f"global batch {global_batch:,} is above MLPerf's largest reference convergence point"
            f" ({rcp.rcp_batch_sizes()[-1]:,}): give the epochs to train",
        )
    if reference.between is None:
        record = rcp.record_at(reference.record["BS"])
        how = "its RCP" if reference.case == rcp.EXACT else f"the smallest RCP's, batch {record['BS']:,}"
        return Runs(tuple(record["Epochs to converge"]), uniform(record), f"{reference_runs_for(global_batch)} ({how})")
    low, high = (rcp.record_at(batch) for batch in reference.between)
    mean, deviation = float(reference.record["RCP Mean"]), float(reference.record["RCP Stdev"])
    nearness = (global_batch - low["BS"]) / (high["BS"] - low["BS"])
    epochs, weights = [], []
    for record, share in ((low, 1 - nearness), (high, nearness)):
        epochs += [mean + deviation * z for z in standardised(record)]
        weights += [share * w for w in uniform(record)]
    return Runs(
        tuple(epochs),
        tuple(weights),
        f"{reference_runs_for(global_batch)} (the RCPs at {low['BS']:,} and {high['BS']:,}, interpolated)",
    )


def reference_runs_for(global_batch: int) -> str:
    return f"MLPerf's reference runs for global batch {global_batch:,}"


def uniform(record: dict[str, object]) -> tuple[float, ...]:
    runs = record["Epochs to converge"]
    assert isinstance(runs, list)
    return (1 / len(runs),) * len(runs)


def standardised(record: dict[str, object]) -> list[float]:
    """An RCP's runs less its mean, over its standard deviation (the checker's own two figures)."""
    runs = record["Epochs to converge"]
    assert isinstance(runs, list)
    return [(epochs - float(record["RCP Mean"])) / float(record["RCP Stdev"]) for epochs in runs]  # type: ignore[arg-type]


def centred_on(runs: Runs, epochs: int) -> Runs:
    """The runs moved so that their olympic mean is `epochs`: a recipe that fixes its epochs, with the spread of the
    reference runs around it."""
    shift = epochs - olympic_epochs(runs)
    return Runs(tuple(e + shift for e in runs.epochs), runs.weights, runs.source)


def olympic_epochs(runs: Runs) -> float:
    """The weighted mean of the runs with the lightest and heaviest tails trimmed as the checker trims its RCP mean:
    one run in each tail's weight."""
    order = np.argsort(runs.epochs)
    epochs, weights = np.array(runs.epochs)[order], np.array(runs.weights)[order]
    tail = min(weights[0], weights[-1])
    kept = np.clip(np.minimum(np.cumsum(weights), np.cumsum(weights[::-1])[::-1]) - tail, 0, weights)
    return float(np.sum(epochs * kept) / np.sum(kept))


@dataclass(frozen=True)
class Stops:
    """Where runs stop: each evaluation epoch a run may stop at and its chance, and where that comes from."""

    epochs: tuple[int, ...]  # ascending
    chances: tuple[float, ...]
    source: str

    def said(self) -> str:
        """ "35 (72 %) or 39 (28 %)"; one stop alone as its epoch."""
        if len(self.epochs) == 1:
            return str(self.epochs[0])
        each = [f"{epoch} ({100 * chance:.0f} %)" for epoch, chance in zip(self.epochs, self.chances, strict=True)]
        return ", ".join(each[:-1]) + " or " + each[-1]

    @property
    def median(self) -> int:
        """The epoch half the runs have stopped by."""
        cumulative = itertools.accumulate(self.chances)
        return next(epoch for epoch, share in zip(self.epochs, cumulative, strict=True) if share >= 0.5 - 1e-9)


def stops(runs: Runs, schedule: Schedule) -> Stops:
    """The evaluation each run stops at under `schedule`'s evaluations, and the chance of each."""
    chances: dict[int, float] = {}
    for epochs, weight in zip(runs.epochs, runs.weights, strict=True):
        stop = first_evaluation_from(math.ceil(epochs - 1e-9), schedule.first_eval, schedule.eval_every)
        chances[stop] = chances.get(stop, 0.0) + weight
    ordered = sorted(chances)
    return Stops(tuple(ordered), tuple(chances[epoch] for epoch in ordered), runs.source)


def first_evaluation_from(epoch: int, first_eval: int, eval_every: int) -> int:
    """The first evaluation at or after `epoch`: a run stops at the evaluation that reaches the target."""
    if epoch <= first_eval:
        return first_eval
    return first_eval + math.ceil((epoch - first_eval) / eval_every) * eval_every


@dataclass(frozen=True)
class Score:
    """An MLPerf score (the olympic mean of five runs, in minutes): its expected value and the range that holds
    COVERAGE of scores."""

    mean: float
    low: float
    high: float


def score(where: Stops, minutes: Callable[[int], float]) -> Score:
    """The olympic mean of five runs that each stop as `where` says, a run that stops at epoch e taking
    `minutes(e)`: every multiset of five stops, with its multinomial chance."""
    times = [minutes(epoch) for epoch in where.epochs]
    outcomes: list[tuple[float, float]] = []  # (minutes, chance)
    for picked in itertools.combinations_with_replacement(range(len(where.epochs)), RUNS):
        chance = math.factorial(RUNS) * math.prod(
            where.chances[i] ** n / math.factorial(n) for i, n in ((i, picked.count(i)) for i in set(picked))
        )
        middle = picked[1:-1]  # combinations come sorted, and a run's minutes rise with its epochs
        outcomes.append((fmean(times[i] for i in middle), chance))
    scores, chances = np.array(outcomes).T
    shares = [(1 - COVERAGE) / 2, (1 + COVERAGE) / 2]  # the smallest score that holds each share of the chance
    low, high = np.quantile(scores, shares, weights=chances, method="inverted_cdf")
    return Score(mean=float(scores @ chances), low=float(low), high=float(high))


def scored(spread: Interval[P], where: Stops, minutes: Callable[[int], float], fixed: int | None) -> Interval[P]:
    """`spread` (projected at `fixed` epochs, or at the median stop) as MLPerf scores it: where the epochs are
    not fixed, the central time to train is the expected score and the assumptions' range moves with it; either
    way the score's COVERAGE range around its mean is the convergence spread widened() adds."""
    result = score(where, minutes)
    shown = spread.central.time_to_train_min
    central = shown if fixed is not None else result.mean
    moved = central / shown
    convergence = Convergence(1 - result.low / result.mean, result.high / result.mean - 1, where.source)
    fastest, slowest = spread.time_to_train_min
    low, high = spread.sensitive_time_to_train_min
    return dataclasses.replace(
        spread,
        central=dataclasses.replace(spread.central, time_to_train_min=central),  # type: ignore[type-var]
        time_to_train_min=(fastest * moved, slowest * moved),
        sensitive_time_to_train_min=(low * moved, high * moved),
        convergence=convergence,
    )


@dataclass(frozen=True)
class Epochs:
    """The epochs a projection trains and where its runs stop, as its report says: `fixed` where the recipe fixes
    them (run.max_epochs), else the stops of MLPerf's reference runs for the global batch."""

    stops: Stops
    fixed: int | None
    source: str

    @property
    def count(self) -> int:
        """The epochs the step breakdown is shown for: the fixed ones, or where half the runs have stopped."""
        return self.fixed if self.fixed is not None else self.stops.median

    def said(self) -> str:
        """How many epochs the time to train is for, in a few words: the fixed ones, or the expected score's."""
        if self.fixed is not None:
            return f"{self.fixed} epochs"
        return f"{score(self.stops, float).mean:.1f} epochs, five runs' olympic mean"


def reference_epochs(global_batch: int, schedule: Schedule) -> Epochs:
    """Where runs at `global_batch` stop under `schedule`'s evaluations: MLPerf's reference runs."""
    where = stops(reference_runs(global_batch), schedule)
    return Epochs(
        where,
        None,
        f"a run stops at epoch {where.said()}: the first evaluation after it converges, as {where.source} in"
        " mlperf-logging; the score is five runs' olympic mean; run.max_epochs=N fixes the epochs",
    )


def given_epochs(epochs: int, global_batch: int, schedule: Schedule) -> Epochs:
    """`epochs` as the recipe fixes them, with the stops runs would spread over around them: the reference runs
    (the largest RCP's above it) moved to an olympic mean of `epochs`."""
    largest = rcp.rcp_batch_sizes()[-1]
    where = stops(centred_on(reference_runs(min(global_batch, largest)), epochs), schedule)
    return Epochs(
        where,
        epochs,
        f"{epochs} (run.max_epochs); a real run stops at the first evaluation after it converges: spread as"
        f" {where.source} around {epochs}, at epoch {where.said()}",
    )


def room_to_converge(epochs: int, global_batch: int) -> str:
    """For a recipe that trains `epochs` whatever, then evaluates its checkpoints (Graphcore's): where MLPerf's
    reference runs for the global batch converge against those epochs. Where they converge moves which checkpoint
    the run stops at, not the epochs it trains."""
    if global_batch > rcp.rcp_batch_sizes()[-1]:
        return f"global batch {global_batch:,} is above MLPerf's largest RCP: no reference run says when it converges"
    runs = reference_runs(global_batch)
    late = sum(w for e, w in zip(runs.epochs, runs.weights, strict=True) if e > epochs + 1e-9)
    verdict = "all within them" if late == 0 else f"{100 * late:.0f} % of them after epoch {epochs}: such a run fails"
    return (
        f"{runs.source} converge in {min(runs.epochs):.1f} to {max(runs.epochs):.1f} epochs: {verdict}; where a run"
        f" converges moves the checkpoint it stops at, not the {epochs} epochs it trains"
    )
