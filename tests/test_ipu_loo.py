"""Leave-one-out over the IPU model's in-sample systems: each projected from a fit to the other two, its own results
unseen, and the range it would have been given; the half-widths those errors give every IPU projection."""

from __future__ import annotations

import json

import pytest

from projection.calibration import evidence_of, print_leave_one_out
from projection.ipu import calibrate
from projection.ipu.cost import Constants, Projection
from projection.uncertainty import Interval

FIT = calibrate.CALIBRATION
EVERY = FIT.left_out


@pytest.fixture(scope="module")
def ranges() -> dict[str, Interval[Projection]]:
    """Each left-out system's range, refitted on the other two at every corner (a few seconds each)."""
    return {left.published.system: FIT.left_out_range(left) for left in EVERY}


@pytest.mark.parametrize("left", EVERY, ids=lambda left: left.published.system)
def test_each_systems_published_figures_fall_in_the_range_it_would_have_been_given_unseen(left, ranges):
    spread, published = ranges[left.published.system], left.published
    low, high = spread.throughput_img_s
    assert low <= published.throughput_img_s <= high
    fastest, slowest = spread.time_to_train_min
    assert fastest <= published.time_to_train_min <= slowest
    assert spread.evidence is not None and left.published.system not in spread.evidence.source  # not its own error


@pytest.mark.parametrize("left", EVERY, ids=lambda left: left.published.system)
def test_the_model_lands_within_10_percent_of_a_system_it_was_not_fitted_to(left):
    assert abs(left.throughput_error_pct) < 10
    assert abs(left.time_to_train_error_pct) < 10
    assert left.projection.steady_epoch_s != pytest.approx(left.published.steady_epoch_s, rel=1e-3)  # truly unseen


@pytest.mark.parametrize("left", EVERY, ids=lambda left: left.published.system)
def test_a_fit_to_two_systems_matches_their_steady_epochs_and_holds_what_they_leave_open_at_its_prior(left):
    others, prior = FIT.others(left.published), FIT.unidentified(left.published)
    fitted = FIT.refitter(others)(Constants())
    assert fitted is not None and fitted == left.central
    assert getattr(fitted, prior) == calibrate.PRIORS[prior].value
    for published in others:
        projection = FIT.project_published(published, fitted)
        assert projection.steady_epoch_s == pytest.approx(published.steady_epoch_s, rel=1e-6)
    expected = "gateway_efficiency" if left.published is calibrate.POD128 else "update_overhead_s"
    assert prior == expected  # only POD128 spans POD64s; only POD16 against POD64 splits the overhead


def test_the_evidence_is_the_three_leave_one_out_errors_as_an_80_percent_prediction_interval():
    evidence = FIT.evidence
    assert evidence is FIT.evidence  # once per process
    assert evidence == evidence_of(EVERY, evidence.source)
    assert 0 < evidence.throughput < 0.2 and 0 < evidence.time_to_train < 0.2
    assert evidence.source == "leave-one-out over ipu_pod16, ipu_pod64, ipu_pod128"
    largest = max(abs(left.throughput_error_pct) for left in EVERY) / 100
    assert evidence.throughput > largest  # t with 3 degrees of freedom at 80 %: 1.64 times the errors' rms


def test_the_calibration_prints_the_leave_one_out_table_and_its_json(ranges, capsys):
    summary = print_leave_one_out(FIT)
    printed = capsys.readouterr().out
    assert "leave-one-out: each system projected from a fit to the other two (80 % ranges)" in printed
    for left in EVERY:
        (row,) = [line for line in printed.splitlines() if line.startswith(f"{left.published.system} ")]
        assert f"{FIT.unidentified(left.published)} " in row and f"{left.throughput_error_pct:+.1f}%" in row
        assert summary[left.published.system]["inside"] == [True, True]  # type: ignore[index]
    assert "median half-width of the leave-one-out ranges above: " in printed
    assert json.loads(json.dumps(summary))["half_width_pct"]["throughput"] == round(100 * FIT.evidence.throughput, 2)
