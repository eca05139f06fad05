"""The projection's error bars: every assumed constant has a range and a reason, the interval holds the central
projection, collapses where the model is fitted, and widens when an assumption is less certain."""

from __future__ import annotations

import dataclasses

import pytest

from backends.ipu_sim import calibrate
from backends.ipu_sim.cost import Constants
from backends.ipu_sim.uncertainty import ASSUMPTIONS, Assumption
from tests.systems import resnet50_profile, system

refit = calibrate.refitter(resnet50_profile(), system("ipu_pod16"))


def scaled(name: str, grad_accum: int = 2, assumptions=ASSUMPTIONS):
    """The interval of the recipe at `grad_accum` on every IPU of `name`, around the POD16 fit."""
    return calibrate.scaled(
        resnet50_profile(), system(name), refit(Constants()), refit, grad_accum, epochs=38, assumptions=assumptions
    )


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


def test_the_fitted_pod16_result_has_no_spread():
    spread = scaled("ipu_pod16", grad_accum=calibrate.POD16.shape.grad_accum)
    low, high = spread.throughput_img_s
    assert high == pytest.approx(low, rel=1e-6) == pytest.approx(calibrate.POD16.throughput_img_s, rel=1e-6)
    assert spread.most_sensitive is None


def test_a_wider_assumption_widens_the_interval_and_becomes_the_most_sensitive():
    narrow = scaled("ipu_pod256")
    latency = ASSUMPTIONS["gateway_latency_s"]
    wider = ASSUMPTIONS | {"gateway_latency_s": Assumption(latency.low, 50 * latency.high, "us", latency.reason)}
    wide = scaled("ipu_pod256", assumptions=wider)
    assert wide.throughput_img_s[0] < narrow.throughput_img_s[0]
    assert wide.time_to_train_min[1] > narrow.time_to_train_min[1]
    assert wide.most_sensitive == "gateway_latency_s"
    assert scaled("ipu_pod64") == scaled("ipu_pod64", assumptions=wider)  # no gateway within one POD64
