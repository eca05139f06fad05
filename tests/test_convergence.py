"""Where runs stop and what it does to a projected MLPerf score: the reference runs mlperf-logging ships (its RCPs),
the olympic mean of five runs, and the spread a projection prints, checked against the RCP lists themselves."""

from __future__ import annotations

import json

import numpy as np
import pytest

from configs.checks import ConfigError
from configs.schema import batch_shape
from mlperf_logs import rcp
from projection.convergence import (
    first_evaluation_from,
    given_epochs,
    olympic_epochs,
    reference_epochs,
    reference_runs,
    room_to_converge,
    score,
    stops,
)
from projection.families import answer
from projection.run import Schedule
from tests.conftest import composed

EVERY_EPOCH = Schedule(100, first_eval=1, eval_every=1)  # a run stops right where it converges


def drawn_scores(epochs: list[int], draws: int = 200_000) -> np.ndarray:
    """MLPerf scores of five runs drawn at random from an RCP's runs, independently of the module's enumeration."""
    runs = np.random.default_rng(0).choice(np.array(epochs, dtype=float), size=(draws, 5))
    return np.sort(runs, axis=1)[:, 1:-1].mean(axis=1)


@pytest.mark.parametrize("batch", rcp.rcp_batch_sizes())
def test_at_an_rcps_batch_runs_stop_where_its_runs_converged_and_score_as_drawn(batch):
    record = rcp.record_at(batch)
    listed = record["Epochs to converge"]
    runs = reference_runs(batch)
    assert sorted(runs.epochs) == sorted(listed) and olympic_epochs(runs) == pytest.approx(record["RCP Mean"])
    where = stops(runs, EVERY_EPOCH)
    assert dict(zip(where.epochs, where.chances, strict=True)) == pytest.approx(
        {epoch: listed.count(epoch) / len(listed) for epoch in set(listed)}
    )
    scored, drawn = score(where, float), drawn_scores(listed)
    assert scored.mean == pytest.approx(drawn.mean(), abs=0.01)
    assert scored.low == pytest.approx(np.quantile(drawn, 0.1, method="inverted_cdf"))
    assert scored.high == pytest.approx(np.quantile(drawn, 0.9, method="inverted_cdf"))


def test_between_rcps_the_runs_take_the_checkers_interpolated_mean_and_deviation():
    for batch in (2048, 20480, 40000):
        record = rcp.reference_for(batch).record
        assert record is not None and rcp.reference_for(batch).case == rcp.INTERPOLATED
        runs = reference_runs(batch)
        weights, epochs = np.array(runs.weights), np.array(runs.epochs)
        assert weights.sum() == pytest.approx(1)
        assert olympic_epochs(runs) == pytest.approx(record["RCP Mean"], abs=0.15), batch
        deviation = np.sqrt(np.sum(weights * (epochs - np.sum(weights * epochs)) ** 2))
        assert deviation == pytest.approx(record["RCP Stdev"], rel=0.15), batch


def test_the_projected_spread_grows_where_the_rcp_spread_grows():
    """The RCPs' runs spread 1.08 epochs about 35 at global batch 1,632, 0.75 about 35 at 3,264 and 0.63 about 68 at
    49,152: a projection evaluating every epoch carries the score's spread that five runs drawn from each list give,
    widest at the smallest batch."""
    spreads = []
    for batch, nodes in ((1632, 4), (3264, 8), (49152, 64)):
        cfg = composed(
            "run.mode=project", "experiment=imagenet", "device=dgx_h100", f"device.nodes={nodes}",
            f"data.global_batch={batch}", "mlperf.first_eval=1", "mlperf.eval_every=1",
        )  # fmt: skip
        figures = json.loads(answer(cfg, batch_shape(cfg, 1), command_line=[]).splitlines()[-1])
        below, above = figures["convergence_pct"]
        drawn = drawn_scores(rcp.record_at(batch)["Epochs to converge"])
        low, mean, high = np.quantile(drawn, 0.1), drawn.mean(), np.quantile(drawn, 0.9)
        assert above - below == pytest.approx(100 * (high - low) / mean, rel=0.15), batch  # the fixed costs dilute it
        spreads.append(above - below)
    assert spreads == sorted(spreads, reverse=True) and spreads[-1] > 0


def test_the_central_time_to_train_is_the_expected_score_of_runs_that_stop_at_evaluations():
    where = reference_epochs(3264, Schedule(40, first_eval=3, eval_every=4))  # evaluations at 3, 7, ..., 35, 39
    assert where.fixed is None and where.stops.epochs == (35, 39) and where.count == 35
    assert "35 (" in where.source and "39 (" in where.source
    chance_late = dict(zip(where.stops.epochs, where.stops.chances, strict=True))[39]
    assert chance_late == pytest.approx(4 / 15)  # the RCP's runs past epoch 35: 36, 36, 36, 37
    scored = score(where.stops, float)
    assert 35 < scored.mean < 39 and (scored.low, scored.high) == (35, pytest.approx(113 / 3))
    assert first_evaluation_from(36, 3, 4) == 39 and first_evaluation_from(2, 3, 4) == 3
    larger = reference_epochs(20480, Schedule(60, first_eval=2, eval_every=4))  # RCP mean 47.3, interpolated
    assert larger.count == 50 and "the RCPs at 3,264 and 32,768, interpolated" in larger.source


def test_given_epochs_are_kept_and_carry_the_reference_spread_around_them():
    given = given_epochs(35, 3264, Schedule(35, first_eval=3, eval_every=4))
    assert given.fixed == given.count == 35 and given.source.startswith("35 (run.max_epochs)")
    assert given.stops.epochs == (35, 39)  # runs spread around 35 that converge after it stop at 39
    beyond = given_epochs(90, 100_000, Schedule(90, first_eval=2, eval_every=4))
    assert beyond.fixed == 90 and "67,840" in beyond.source  # the largest RCP's spread above it


def test_a_batch_above_the_largest_rcp_needs_its_epochs():
    with pytest.raises(ConfigError, match="above MLPerf's largest reference convergence point"):
        reference_epochs(100_000, Schedule(40))


def test_a_recipe_that_fixes_its_epochs_is_told_whether_the_reference_runs_converge_within_them():
    assert "all within them" in room_to_converge(38, 3840)
    assert "% of them after epoch 34: such a run fails" in room_to_converge(34, 3840)
    assert "no reference run says" in room_to_converge(38, 100_000)
