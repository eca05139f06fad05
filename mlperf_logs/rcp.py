"""The RCP verdict in plain words: which reference convergence point (RCP) mlperf_logging's RCP checker holds a
ResNet result against at its global batch size, whether the result passes, and how its score is normalised.

The RCPs, the interpolation, the acceptance test and the normalisation factor are the checker's own (`RCP_Checker`
on the pruned RCPs, which the package checker and the result summarizer use); only the explanation is written here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlperf_logs.compliance import RULESET, USAGE

BENCHMARK = "resnet"
PRUNED = "pruned_rcps"
EXACT, INTERPOLATED, BELOW_SMALLEST, ABOVE_LARGEST = "exact", "interpolated", "below smallest", "above largest"
NOT_CONVERGED = 1e9  # the convergence epoch the checker gives a run that did not converge


@dataclass(frozen=True)
class Reference:
    """The RCP a global batch size is judged against, and how the checker found it."""

    case: str  # EXACT | INTERPOLATED | BELOW_SMALLEST | ABOVE_LARGEST
    batch: int
    record: dict[str, Any] | None  # the checker's ('BS', 'RCP Mean', 'Min Epochs', ...); None above the largest RCP
    between: tuple[int, int] | None = None  # the RCP batch sizes an interpolated record lies between


@dataclass(frozen=True)
class Verdict:
    reference: Reference
    epochs: tuple[float, ...]  # each run's convergence epoch, NOT_CONVERGED for a run that did not converge
    passed: bool
    norm_factor: float

    @property
    def mean_epochs(self) -> float:
        """The olympic mean the checker compares: the fastest and the slowest run dropped."""
        return float(np.mean(sorted(self.epochs)[1:-1]))

    @property
    def converged(self) -> bool:
        """At most one run may fail to converge (it counts as the slowest)."""
        return sum(e >= NOT_CONVERGED for e in self.epochs) <= 1


def rcp_checker() -> Any:
    """mlperf_logging's RCP checker, imported where it is first asked for: it loads scipy.stats, a second of every
    train.py start that no training run needs (only projections and packages ask it)."""
    from mlperf_logging.rcp_checker import rcp_checker

    return rcp_checker


@functools.cache
def checker() -> Any:
    """The checker's RCP_Checker on the pruned RCPs."""
    return rcp_checker().RCP_Checker(USAGE, RULESET, BENCHMARK, verbose=False)


def rcp_batch_sizes() -> list[int]:
    """The global batch sizes of the pruned RCPs, ascending."""
    return sorted(record["BS"] for record in checker().pruned_rcp_data.values())


def record_at(batch: int) -> dict[str, Any]:
    """The pruned RCP at exactly `batch` with its runs ("Epochs to converge", ascending)."""
    record = checker()._find_rcp(batch, PRUNED)
    assert record is not None, f"no RCP at global batch {batch}"
    return dict(record)


def reference_for(batch: int) -> Reference:
    """The RCP for `batch`, found the way `rcp_checker.check_directory` finds it (which returns only a message)."""
    rcps = checker()
    record = rcps._find_rcp(batch, PRUNED)
    if record is not None:
        return Reference(EXACT, batch, record)
    low, high = rcps._find_top_min_rcp(batch, PRUNED), rcps._find_bottom_max_rcp(batch, PRUNED)
    if low is not None and high is not None:
        _, interpolated = rcps._create_interp_rcp(batch, low, high)
        return Reference(INTERPOLATED, batch, interpolated, (low["BS"], high["BS"]))
    if high is not None:
        return Reference(BELOW_SMALLEST, batch, rcps._find_min_rcp(PRUNED))
    return Reference(ABOVE_LARGEST, batch, None)


def judge(batch: int, epochs: list[float]) -> Verdict:
    """The checker's verdict on runs at `batch` that converged after `epochs` (one per run)."""
    reference = reference_for(batch)
    verdict = Verdict(reference, tuple(epochs), passed=False, norm_factor=1.0)
    if reference.record is None or not verdict.converged:
        return verdict
    passed, factor = checker()._eval_submission_record(dict(reference.record), list(epochs), "")
    return Verdict(reference, tuple(epochs), bool(passed), float(factor))


def judge_results(results_dir: Path) -> Verdict | None:
    """The verdict on a directory of result_*.txt logs; None when their batch sizes cannot be read or differ."""
    files = sorted(str(path) for path in results_dir.glob("result_*.txt"))
    batch, epochs, _ = rcp_checker().get_submission_epochs(files, RULESET, False)
    if batch == -1:
        return None
    return judge(batch, epochs if epochs is not None else [NOT_CONVERGED] * len(files))


def explain(verdict: Verdict) -> str:
    """The verdict in plain words: the case, the comparison, the normalisation."""
    return "\n".join([explain_reference(verdict.reference), explain_result(verdict), explain_normalisation(verdict)])


def explain_reference(reference: Reference) -> str:
    batch, record = reference.batch, reference.record
    if record is None:
        return (
            f"Global batch {batch} is above the largest RCP batch size ({rcp_batch_sizes()[-1]}): the checker has "
            f"nothing to compare with and fails with 'Missing RCP, please submit RCP with BS = {batch}'."
        )
    accepted = f"an olympic mean of {record['RCP Mean']:.2f} epochs, and the checker accepts a mean of at least "
    accepted += f"{record['Min Epochs']:.2f} epochs"
    if reference.case == EXACT:
        return f"An RCP exists at exactly global batch {batch}: the reference runs converged in {accepted}."
    if reference.case == INTERPOLATED:
        low, high = reference.between or (0, 0)
        return (
            f"No RCP at global batch {batch}: it lies between the RCPs at {low} and {high}, and the checker "
            f"interpolates linearly between them to {accepted}."
        )
    return (
        f"Global batch {batch} is below the smallest RCP batch size ({record['BS']}). The checker then "
        f"holds the runs against that smallest RCP ({accepted}): converging at least that slowly passes "
        "('RCP not found but slower convergence on smaller batch size'); converging faster fails with "
        f"'Missing RCP, please submit RCP with BS = {batch}', i.e. reference runs at this batch size would have to "
        "be submitted as a new RCP."
    )


def explain_result(verdict: Verdict) -> str:
    if not verdict.converged:
        return "More than one run did not converge: the checker fails with 'Insufficient convergence'."
    if verdict.reference.record is None:
        return f"These runs converge in an olympic mean of {verdict.mean_epochs:.2f} epochs. RCP verdict: FAIL."
    runs = ", ".join("not converged" if e >= NOT_CONVERGED else f"{e:g}" for e in verdict.epochs)
    outcome = "PASS" if verdict.passed else "FAIL"
    return (
        f"These runs converge in an olympic mean of {verdict.mean_epochs:.2f} epochs ({runs}). RCP verdict: {outcome}."
    )


def explain_normalisation(verdict: Verdict) -> str:
    record = verdict.reference.record
    if record is None or not verdict.converged:
        return "No normalisation: the result fails the RCP check."
    if not verdict.passed:
        return (
            f"No normalisation: the runs converge faster than the checker allows (it would take a factor of "
            f"{record['RCP Mean']:.2f} / {verdict.mean_epochs:.2f} = {verdict.norm_factor:.4f}, beyond the largest "
            f"speed-up the reference's spread permits, {record['Max Speedup']:.4f}). The package checker fails unless "
            "run with --rcp-bypass, which lets it pass with a warning for the submission committee to review; even "
            "then no scaling.json is written, so the score is not normalised."
        )
    if verdict.norm_factor > 1.0:
        return (
            f"Normalisation factor {record['RCP Mean']:.2f} / {verdict.mean_epochs:.2f} = {verdict.norm_factor:.4f}: "
            "the runs converge faster than the reference mean (within the speed-up the checker allows), so the "
            "package checker writes the factor to scaling.json and the result summarizer multiplies the "
            "time-to-train by it, as if the runs had needed the reference's epochs."
        )
    return (
        "Normalisation factor 1: the runs converge no faster than the reference mean, so the score stands as measured."
    )
