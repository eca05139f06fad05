"""Leave-one-out over the IPU model's in-sample systems: each projected from a fit to the other two, its own results
unseen, and the range it would have been given; the half-widths those errors give every IPU projection."""

from __future__ import annotations

import json

import pytest

from projection.ipu import calibrate
from projection.ipu.cost import Constants, Projection
from projection.uncertainty import Interval
from tests.systems import resnet50_profile

SYSTEMS = calibrate.in_sample_systems()
EVERY = [calibrate.left_out(resnet50_profile(), SYSTEMS, published) for published in calibrate.IN_SAMPLE]


@pytest.fixture(scope="module")
def rows() -> list[tuple[calibrate.LeftOut, Interval[Projection]]]:
    """Each left-out system with its range, refitted on the other two at every corner (a few seconds each)."""
    return calibrate.leave_one_out(resnet50_profile(), SYSTEMS)


@pytest.fixture(scope="module")
def ranges(rows) -> dict[str, Interval[Projection]]:
    return {left.published.system: spread for left, spread in rows}


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
    others = calibrate.others(left.published)
    fitted = calibrate.refitter(resnet50_profile(), SYSTEMS, others)(Constants())
    assert fitted is not None
    assert getattr(fitted, left.prior) == calibrate.PRIORS[left.prior].value
    for published in others:
        projection = calibrate.project_published(resnet50_profile(), SYSTEMS[published.system], published, fitted)
        assert projection.steady_epoch_s == pytest.approx(published.steady_epoch_s, rel=1e-6)
    expected = "gateway_efficiency" if left.published is calibrate.POD128 else "update_overhead_s"
    assert left.prior == expected  # only POD128 spans POD64s; only POD16 against POD64 splits the overhead


def test_the_evidence_is_the_three_leave_one_out_errors_as_an_80_percent_prediction_interval():
    evidence = calibrate.evidence()
    assert evidence is calibrate.evidence()  # once per process
    assert evidence == calibrate.evidence_of(EVERY)
    assert 0 < evidence.throughput < 0.2 and 0 < evidence.time_to_train < 0.2
    assert evidence.source == "leave-one-out over ipu_pod16, ipu_pod64, ipu_pod128"
    largest = max(abs(left.throughput_error_pct) for left in EVERY) / 100
    assert evidence.throughput > largest  # t with 3 degrees of freedom at 80 %: 1.64 times the errors' rms


def test_the_calibration_prints_the_leave_one_out_table_and_its_json(rows, capsys):
    assert [left for left, _ in rows] == EVERY
    summary = calibrate.print_leave_one_out(rows)
    printed = capsys.readouterr().out
    assert "leave-one-out: each system projected from a fit to the other two (80 % ranges)" in printed
    for left in EVERY:
        (row,) = [line for line in printed.splitlines() if line.startswith(f"{left.published.system} ")]
        assert f"{left.prior} " in row and f"{left.throughput_error_pct:+.1f}%" in row
        assert summary[left.published.system]["inside"] == [True, True]  # type: ignore[index]
    assert "median half-width of the leave-one-out ranges above: " in printed
    assert json.loads(json.dumps(summary))["half_width_pct"]["throughput"] == round(
        100 * calibrate.evidence().throughput, 2
    )
