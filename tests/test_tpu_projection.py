"""The TPU family's projection: its calibration on Google's six in-sample results (each within 3 %, each projected
from a fit on the other five), the cost model's terms where a TPU engineer expects them, every chip and slice
projected with the other families' keys, and the command line honouring the recipe's epochs and evaluations."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest

from configs.schema import batch_shape
from projection.families import answer
from projection.run import Schedule
from projection.tpu import calibrate, cost
from projection.tpu.calibrate import IN_SAMPLE
from projection.tpu.config import TpuChip, torus_shape
from tests.conftest import composed

CHIPS = ("v2", "v3", "v4", "v5e", "v5p", "v6e", "v7")


@pytest.fixture(scope="module")
def fit():
    return calibrate.CALIBRATION


def test_every_in_sample_system_is_projected_within_3_percent_inside_its_range(fit):
    for published in IN_SAMPLE:
        spread = fit.in_sample_interval(published)
        projection = spread.central
        assert projection.throughput_img_s == pytest.approx(published.throughput_img_s, rel=0.03), published.system
        assert projection.time_to_train_min == pytest.approx(published.time_to_train_min, rel=0.03), published.system


def test_each_in_sample_system_is_projected_from_the_other_five_inside_the_range_they_give_it(fit):
    assert [result.published for result in fit.left_out] == list(IN_SAMPLE)
    for result in fit.left_out:
        published = result.published
        assert result.projection != fit.project_published(published, fit.central), published.system  # unseen
        spread = fit.left_out_range(result)
        low, high = spread.throughput_img_s
        assert low <= published.throughput_img_s <= high, published.system
        fastest, slowest = spread.time_to_train_min
        assert fastest <= published.time_to_train_min <= slowest, published.system
        assert abs(result.throughput_error_pct) < 10, published.system
    assert 0 < fit.evidence.throughput < 0.15 and 0 < fit.evidence.time_to_train < 0.25


def test_the_fitted_constants_are_physical_and_the_defaults(fit):
    central = fit.central
    assert 0 < central.mxu_efficiency <= 1 and 0 < central.traffic_fraction <= 1
    assert 0 < central.hop_latency_s < 10e-6 and 0 < central.optimizer_tensor_s < 100e-6
    for name in calibrate.FITTED:
        assert getattr(cost.Constants(), name) == pytest.approx(getattr(central, name), rel=1e-3), name


@functools.cache
def load_chip(name: str) -> TpuChip:
    return calibrate.load_chip(f"tpu_{name}")


def layout(chip_name: str, chips: int, per_replica: int, bn_group: int = 1) -> tuple[cost.Layout, TpuChip]:
    chip = load_chip(chip_name)
    cores = chip.tensorcores if chip.megacore else 1
    replicas = chips * chip.tensorcores // cores
    hosts = -(-chips // chip.chips_per_host)
    torus = torus_shape(chips, chip.torus_dims)
    return cost.Layout(chips, replicas, per_replica, bn_group, torus, hosts, cores), chip


def test_the_rate_per_chip_falls_with_the_batch_per_replica_and_more_on_a_wider_mxu(fit):
    rates = []
    for batch in (256, 64, 16, 8):
        slice_, chip = layout("v4", 64, batch)
        rates.append(batch / cost.step_time(fit.profile, chip, slice_, fit.central).device_s)
    assert rates == sorted(rates, reverse=True)
    assert cost.mxu_fill(fit.profile, load_chip("v7"), 8) < cost.mxu_fill(fit.profile, load_chip("v4"), 8)


def test_the_all_reduce_has_one_reduction_per_torus_dimension_and_grows_with_the_slice(fit):
    small, chip = layout("v4", 64, 16)
    large, _ = layout("v4", 4096, 16)
    flat, flat_chip = layout("v3", 1024, 16)
    steps = [
        cost.step_time(fit.profile, c, s, fit.central) for s, c in ((small, chip), (large, chip), (flat, flat_chip))
    ]
    assert [len(step.allreduce_s) for step in steps] == [3, 3, 2]
    assert sum(steps[1].allreduce_s) > sum(steps[0].allreduce_s)
    per_tensor = dataclasses.replace(small, reductions=161)
    assert sum(cost.step_time(fit.profile, chip, per_tensor, fit.central).allreduce_s) > sum(steps[0].allreduce_s)


def test_batchnorm_groups_cost_only_across_chips_and_sharding_the_optimizer_wins_at_scale(fit):
    one, chip = layout("v4", 256, 16)
    grouped = dataclasses.replace(one, bn_group=4)
    assert cost.step_time(fit.profile, chip, one, fit.central).batchnorm_s == 0
    assert cost.step_time(fit.profile, chip, grouped, fit.central).batchnorm_s > 0
    few, _ = layout("v4", 4, 256)
    assert cost.step_time(fit.profile, chip, one, fit.central).optimizer_sharded
    unsharded = dataclasses.replace(one, optimizer_sharded=False)
    assert (
        cost.step_time(fit.profile, chip, unsharded, fit.central).optimizer_s
        > cost.step_time(fit.profile, chip, one, fit.central).optimizer_s
    )
    assert cost.step_time(fit.profile, chip, few, fit.central).device_s > 0


def test_host_calls_are_one_per_block_or_per_steps_per_call(fit):
    slice_, _ = layout("v4", 64, 64)
    schedule = Schedule(40)
    assert cost.host_calls(slice_, schedule) == len(schedule.eval_epochs())
    per_100 = dataclasses.replace(slice_, steps_per_call=100)
    assert cost.host_calls(per_100, schedule) == -(-40 * cost.steps_per_epoch(slice_, schedule) // 100)


@pytest.mark.parametrize("chip", CHIPS)
def test_every_chip_projects_at_every_slice_it_offers(fit, chip):
    tpu = load_chip(chip)
    for chips in tpu.offered():
        slice_, _ = layout(chip, chips, 32)
        projection = cost.project(fit.profile, tpu, slice_, fit.central, Schedule(40))
        assert projection.throughput_img_s > 0 and projection.time_to_train_min > 0, (chip, chips)


@pytest.mark.parametrize(("chip", "chips", "batch"), [("v4", 256, 4096), ("v5p", 64, 2048)])
def test_a_slice_projects_with_the_other_families_keys_and_says_what_calibrates_it(chip, chips, batch):
    cfg = composed(
        "run.mode=project", "experiment=imagenet", f"device=tpu_{chip}", f"device.chips={chips}",
        f"data.global_batch={batch}",
    )  # fmt: skip
    text = answer(cfg, batch_shape(cfg, 1), command_line=[])
    figures = json.loads(text.splitlines()[-1])
    keys = {"throughput_img_s", "throughput_img_s_range", "time_to_train_min", "time_to_train_min_range"}
    assert keys | {"beyond_calibration", "img_s_per_chip"} <= figures.keys()
    for term in ("MXU", "memory-bound", "BatchNorm sums", "all-reduce along dimension 3", "optimizer (LARS", "host"):
        assert term in text
    assert f"Google's name counts TensorCores): {chips} TPU {chip} chips" in text
    uncalibrated = "no published ResNet-50 result calibrates TPU v5p" in text
    assert uncalibrated == (chip == "v5p") == bool(figures["beyond_calibration"])


def test_a_projection_honours_the_epochs_and_evaluations_it_is_given():
    command_line = [
        "run.mode=project", "experiment=imagenet", "device=tpu_v3", "device.chips=8", "data.global_batch=1024",
        "run.max_epochs=20", "mlperf.first_eval=2", "mlperf.eval_every=6",
    ]  # fmt: skip
    cfg = composed(*command_line)
    text = answer(cfg, batch_shape(cfg, 1), command_line=command_line)
    assert "4 of them in 20 epochs" in text  # evaluations after epochs 2, 8, 14 and 20
    assert "v3-16 (Google's name counts TensorCores): 8 TPU v3 chips" in text
    assert json.loads(text.splitlines()[-1])["time_to_train_min"] > 0
