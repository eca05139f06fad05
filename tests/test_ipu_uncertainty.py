"""The projection's error bars: every assumed constant has a range and a reason, the interval holds the central
projection, collapses where the model is fitted, and widens when an assumption is less certain."""

from __future__ import annotations

import dataclasses

import pytest

from projection.ipu import calibrate, cost
from projection.ipu.assumptions import ASSUMPTIONS
from projection.ipu.cost import Constants
from projection.uncertainty import Assumption, column, corners, headline, report, widened
from tests.systems import system

refit = calibrate.CALIBRATION.refit


def scaled(name: str, grad_accum: int = 2, assumptions=ASSUMPTIONS):
    """The interval of the recipe at `grad_accum` on every IPU of `name`, around the in-sample fit."""
    return calibrate.scaled(system(name), grad_accum, epochs=41, assumptions=assumptions)


def test_every_assumption_has_a_reason_and_a_range_around_its_central_value():
    fitted = set(calibrate.FITTED)
    assumed = {field.name for field in dataclasses.fields(Constants)} - fitted
    assert set(ASSUMPTIONS) == assumed
    for name, assumption in ASSUMPTIONS.items():
        assert assumption.low < getattr(Constants(), name) < assumption.high, name
        assert len(assumption.reason) > 20, name


SYSTEMS = [name for names in calibrate.SYSTEMS.values() for name in names]


@pytest.mark.parametrize("name", SYSTEMS)
def test_every_system_composes_with_its_hosts_and_gateways(name):
    composed = system(name)
    assert composed.name == name and composed.ipus == int(name.rsplit("pod", 1)[1])
    assert composed.chip.name == ("bow" if name.startswith("bow") else "gc200")
    assert composed.hosts == composed.ipus // 16 and composed.host_cores == 128 * composed.hosts  # 2 x EPYC 7742
    assert composed.chip.ipus_per_pod == 64 and composed.chip.ipus_per_machine == 4


@pytest.mark.parametrize("name", SYSTEMS)
def test_the_interval_holds_the_central_projection_strictly_inside(name):
    spread = scaled(name)  # K=2: no system here runs the fitted POD16 recipe, so every one has a spread
    central = spread.central
    low, high = spread.throughput_img_s
    assert low < central.throughput_img_s < high
    first, last = spread.time_to_train_min
    assert first < central.time_to_train_min < last


def test_every_corner_the_in_sample_results_allow_keeps_their_steady_epochs():
    """The ranges come from the evidence: each corner is refitted, and one the results leave no fit for is out."""
    fits = [refit(corner) for corner in corners(refit(Constants()), ASSUMPTIONS)]
    feasible = [fitted for fitted in fits if fitted is not None]
    assert 0 < len(feasible) <= len(fits)
    for fitted in feasible[:: max(1, len(feasible) // 8)]:
        assert 0 < fitted.compute_efficiency <= 1 and fitted.update_overhead_s >= 0 and fitted.eval_overhead_s >= 0
        for published in calibrate.IN_SAMPLE:
            projection = calibrate.CALIBRATION.project_published(published, fitted)
            assert projection.steady_epoch_s == pytest.approx(published.steady_epoch_s, rel=1e-6)


def test_a_wider_assumption_widens_the_interval_and_becomes_the_most_sensitive():
    narrow = scaled("ipu_pod256")
    growth = ASSUMPTIONS["gateway_growth"]  # no in-sample system spans more than 2 POD64s to pin it
    wider = ASSUMPTIONS | {"gateway_growth": Assumption(growth.low, 4 * growth.high, "", growth.reason)}
    wide = scaled("ipu_pod256", assumptions=wider)
    assert wide.throughput_img_s[0] < narrow.throughput_img_s[0]
    assert wide.time_to_train_min[1] > narrow.time_to_train_min[1]
    assert wide.most_sensitive == "gateway_growth"
    assert scaled("ipu_pod64") == scaled("ipu_pod64", assumptions=wider)  # no gateway within one POD64


def test_the_headline_gives_the_answer_and_the_range_80_percent_of_results_should_land_in():
    assumed = scaled("ipu_pod64", grad_accum=3)  # experiment=mlperf_pod64's layout
    rate = assumed.central.throughput_img_s  # the POD64's steady epochs fix it: no assumption moves it
    assert assumed.throughput_img_s == pytest.approx((rate, rate), rel=1e-12)
    evidence = calibrate.CALIBRATION.evidence
    spread = widened(assumed, evidence)  # the model's error off its fit still widens it
    assert spread.throughput_img_s == pytest.approx(
        (rate * (1 - evidence.throughput), rate * (1 + evidence.throughput))
    )
    (fastest, slowest), (low, high) = spread.time_to_train_min, spread.throughput_img_s
    assert headline(spread, "41 epochs") == (
        f"projected time to train (41 epochs): {spread.central.time_to_train_min:.2f} min at {rate:,.0f} img/s;"
        f" 80 % of real results should land in {fastest:.2f} to {slowest:.2f} min and {low:,.0f} to {high:,.0f} img/s"
    )
    said = report(spread, refit(Constants()), ASSUMPTIONS)
    assert f"the model's error off its fit: +-{100 * evidence.throughput:.1f} % throughput" in said
    assert f"({evidence.source})" in said
    shortest, longest = assumed.time_to_train_min  # the assumptions' own ranges, a throughput no assumption moves
    assert (
        "the assumed constants alone: throughput no assumed constant moves it,"
        f" time to train {shortest:.3f} to {longest:.3f} min"
    ) in said


def test_a_tables_range_that_no_assumption_moves_reads_fixed_not_a_range_of_zero_width():
    """python -m projection.ipu.calibrate's tables: the POD64's throughput printed "108,115-108,115" before."""
    rate = scaled("ipu_pod64", grad_accum=3).throughput_img_s
    assert column(*rate, "{:,.0f}".format) == "fixed"
    assert column(29498.2, 29542.4, "{:,.0f}".format) == "29,498-29,542"


def test_the_update_programs_clock_share_widens_the_bow_and_moves_no_gc200():
    """update_overhead_s is fitted on GC200s, so its clock share is inert there and one fit serves both its ends; on
    the Bow's 1.85 GHz, all of it in cycles is 28 % less, and the range spans that."""
    assert {s.chip.clock_hz for s in calibrate.CALIBRATION.systems.values()} == {cost.FITTED_CLOCK_HZ}
    central = refit(Constants())
    assert central is not None
    ends = [dataclasses.replace(central, update_cycles_share=share) for share in (0.0, 1.0)]
    assert [refit(end) for end in ends] == ends  # the fit itself does not move
    for name in ("ipu_pod256", "bow_pod256"):
        seconds, cycles = (cost.update_fixed_s(system(name), end) for end in ends)
        assert seconds == central.update_overhead_s
        assert cycles == pytest.approx(central.update_overhead_s * cost.FITTED_CLOCK_HZ / system(name).chip.clock_hz)
    alone = {"update_cycles_share": ASSUMPTIONS["update_cycles_share"]}
    for name, moves in (("ipu_pod16", False), ("bow_pod16", True)):
        low, high = scaled(name, assumptions=alone).throughput_img_s
        assert (high > low * (1 + 1e-3)) is moves
