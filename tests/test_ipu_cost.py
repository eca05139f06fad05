"""The IPU cost model: all-reduce, pipelining, host feed and the calibration against Graphcore's MLPerf results."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from projection.ipu import calibrate, cost
from projection.ipu.config import System
from projection.ipu.cost import Constants, RunShape, ring_allreduce_s, step_time
from projection.profile import ModelProfile
from projection.run import Schedule
from tests.conftest import config_error
from tests.systems import resnet50_profile, system


def shape(replicas: int, grad_accum: int = 10, **kwargs) -> RunShape:
    return RunShape(replicas, micro_batch=20, grad_accum=grad_accum, **kwargs)


def split(profile: ModelProfile, stages: int, output_bytes: float = 8e6) -> ModelProfile:
    """The one-stage profile cut into `stages` equal pipeline stages, each but the last sending `output_bytes`."""
    (whole,) = profile.stages
    shares = ("forward_flops", "backward_flops", "recompute_flops", "memory_bytes", "activation_bytes")
    stage = dataclasses.replace(
        whole, param_count=whole.param_count // stages, **{name: getattr(whole, name) / stages for name in shares}
    )
    cut = (dataclasses.replace(stage, output_bytes=output_bytes),) * (stages - 1)
    return dataclasses.replace(profile, stages=(*cut, stage))


def with_gateway(system: System, bandwidth: float) -> System:
    return dataclasses.replace(system, chip=dataclasses.replace(system.chip, gateway_bandwidth=bandwidth))


def test_merged_allreduce_beats_per_tensor_by_more_at_256_ipus_than_at_16():
    gaps = []
    for name, replicas in (("ipu_pod16", 16), ("ipu_pod256", 256)):
        merged = step_time(resnet50_profile(), system(name), shape(replicas), Constants())
        per_tensor = step_time(resnet50_profile(), system(name), shape(replicas, merged_allreduce=False), Constants())
        assert merged.total_s < per_tensor.total_s
        gaps.append(per_tensor.total_s - merged.total_s)
    assert 0 < 2 * gaps[0] < gaps[1]


@pytest.mark.parametrize("name", ["ipu_pod256", "bow_pod256"])
def test_gateway_bandwidth_changes_nothing_within_a_pod64_and_matters_beyond(name):
    full = system(name)
    slow = with_gateway(full, full.chip.gateway_bandwidth / 10)
    for replicas in (16, 64, 128, 256):
        times = [step_time(resnet50_profile(), s, shape(replicas, 2), Constants()).total_s for s in (full, slow)]
        if replicas <= 64:
            assert times[1] == times[0]
        else:
            assert times[1] > 1.02 * times[0]


def test_beyond_a_pod64_gradients_go_reduce_scatter_gateway_all_gather():
    pod256, constants = system("ipu_pod256"), Constants()
    grad_bytes, chip = 2 * resnet50_profile().param_count, pod256.chip
    # each IPU's 1/64 shard between two POD64s, at its share of its machine's 2 x 100 Gbps
    share = chip.gateway_bandwidth * constants.gateway_efficiency / chip.ipus_per_machine
    assert chip.gateway_bandwidth == 25e9 and chip.ipus_per_machine == 4
    pair = ring_allreduce_s(grad_bytes / 64, 2, share, constants.gateway_latency_s, 1)
    for replicas, pods in ((128, 2), (256, 4)):
        step = step_time(resnet50_profile(), pod256, shape(replicas, 2), constants)
        # reduce-scatter and all-gather within each POD64: one ring's worth over its 64 replicas
        assert step.allreduce_s == pytest.approx(
            ring_allreduce_s(grad_bytes, 64, chip.link_bandwidth, constants.collective_latency_s, 1)
        )
        assert step.gateway_s == pytest.approx(pair * (pods - 1) ** constants.gateway_growth)
        assert step.sync_s == 3 * constants.gateway_sync_s
    within = step_time(resnet50_profile(), pod256, shape(64, 2), constants)
    assert within.gateway_s == 0 and within.sync_s == 3 * constants.sync_s


@pytest.mark.parametrize("constant", ["gateway_efficiency", "gateway_latency_s", "gateway_sync_s", "gateway_growth"])
def test_a_cross_pod_constant_changes_nothing_within_one_pod64(constant):
    changed = dataclasses.replace(Constants(), **{constant: 3 * getattr(Constants(), constant) + 0.5})
    for name, replicas in (("ipu_pod64", 16), ("ipu_pod64", 64), ("bow_pod64", 64), ("ipu_pod256", 256)):
        steps = [step_time(resnet50_profile(), system(name), shape(replicas, 2), c) for c in (Constants(), changed)]
        assert (steps[0] == steps[1]) == (replicas <= 64), (name, replicas)


def test_host_round_trips_cost_more_with_more_host_processes():
    """Each round trip averages the outfeed over every instance (2 replicas each): more hosts, more hops."""
    costs = [cost.host_call_s(shape(replicas), Constants()) for replicas in (2, 16, 64, 128, 256)]
    assert costs == sorted(costs) and len(set(costs)) == len(costs)
    assert costs[0] == Constants().host_sync_s + Constants().instance_sync_s  # one instance: nothing to average


def test_host_round_trips_follow_graphcores_log_interval():
    """train.py runs one log interval (an epoch's updates over 5) per session.run: 80, 66, 50, 25 updates."""
    assert [cost.updates_per_host_call(1_281_167, batch) for batch in (3200, 3840, 5120, 10240)] == [80, 66, 50, 25]
    assert cost.updates_per_host_call(1_281_167, 32) == 1000  # batches_per_step caps a call at 1000


@pytest.mark.parametrize("published", calibrate.IN_SAMPLE, ids=lambda p: p.system)
def test_logged_epochs_place_checkpoints_where_the_v1_1_logs_do(published):
    """A checkpoint lands in the epoch it closes at POD16 and POD128, and in the next one at POD64 (its 66-update
    round trips cross the epoch before the checkpoint's iteration); the last epoch holds the leftover round trip;
    and as many checkpoints are written as the logs evaluate: 10 at POD16 and POD64, 11 at POD128."""
    constants, call_s = Constants(), 1.0
    run = calibrate.shape(published)
    training = cost.training_loop(system(published.device), published.schedule, run, call_s, constants)
    epochs = training.epochs_s
    assert training.checkpoints == {"ipu_pod16": 10, "ipu_pod64": 10, "ipu_pod128": 11}[published.system]
    steady = cost.host_calls_per_epoch(published.schedule, run) * call_s
    assert len(epochs) == published.schedule.epochs
    slow = [n for n, seconds in enumerate(epochs, 1) if seconds >= steady + constants.checkpoint_s]
    first = published.schedule.first_eval + (1 if published.system == "ipu_pod64" else 0)
    assert slow[:3] == [first, first + 4, first + 8]
    assert epochs[-1] >= steady + call_s + constants.checkpoint_s  # the last round trip runs in full


@pytest.mark.parametrize("name", [name for names in calibrate.SYSTEMS.values() for name in names])
def test_bow_systems_run_graphcores_v2_0_train_py_and_ipu_pods_v1_1s(name):
    assert system(name).mlperf_round == ("v2.0" if name.startswith("bow") else "v1.1")
    assert cost.mlperf_round(system(name)).meta_graph == name.startswith("ipu")


# The v2.0 recipes (configs.yml, mk2_resnet50_mlperf_pod{16,64,128,256}_lars): epochs, b x K x R, and the epochs whose
# checkpoints train.py writes, counting back from the last by epochs_per_ckpt (4): epochs % 4 is the first.
V2_0 = {
    "bow_pod16": (38, (22, 10, 16), [2, 6, 10, 14, 18, 22, 26, 30, 34, 38]),
    "bow_pod64": (40, (20, 4, 64), [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]),
    "bow_pod128": (41, (20, 2, 128), [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41]),
    "bow_pod256": (45, (20, 2, 256), [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45]),
}


@pytest.mark.parametrize("name", V2_0)
def test_v2_0_checkpoints_count_back_from_the_last_epoch_and_write_no_meta_graph(name):
    """Whatever first_eval says (here v1.1's 2), a v2.0 system checkpoints every 4 epochs ending at the last, each
    costing the variables' save alone; a v1.1 system keeps first_eval (with one more at the end of 40 and 45 epochs)
    and its checkpoint_s. A logged epoch holds whole round trips, so a checkpoint lands in its epoch or the next."""
    epochs, (micro_batch, grad_accum, replicas), expected = V2_0[name]
    updates = cost.updates_per_host_call(1_281_167, micro_batch * grad_accum * replicas)
    run, schedule, call_s = RunShape(replicas, micro_batch, grad_accum, updates), Schedule(epochs, first_eval=2), 1.0
    constants = dataclasses.replace(Constants(), catch_up_s=0.0, checkpoint_s=5.0, variables_checkpoint_s=2.0)
    steady = cost.host_calls_per_epoch(schedule, run) * call_s
    round_trips = math.ceil(1_281_167 * epochs // run.global_batch / updates)
    v1_1 = sorted({*range(2, epochs + 1, 4), epochs})
    for round_, pause_s, checkpointed in (("v2.0", 2.0, expected), ("v1.1", 5.0, v1_1)):
        ran = dataclasses.replace(system(name), mlperf_round=round_)
        assert cost.checkpoint_schedule(ran, schedule).eval_epochs() == checkpointed
        training = cost.training_loop(ran, schedule, run, call_s, constants)
        assert training.checkpoints == len(checkpointed)
        assert sum(training.epochs_s) == pytest.approx(round_trips * call_s + len(checkpointed) * pause_s)
        landed = [n for n, seconds in enumerate(training.epochs_s, 1) if seconds >= steady + pause_s]
        assert all(0 <= n - e <= 1 for n, e in zip(landed, checkpointed, strict=True))


def test_an_unknown_round_is_refused_by_name():
    with pytest.raises(ValueError, match=re.escape("bow_pod16: mlperf_round 'v3.0' is not one of v1.1, v2.0")):
        cost.mlperf_round(dataclasses.replace(system("bow_pod16"), mlperf_round="v3.0"))
    said = config_error("device=bow_pod16", "device.system.mlperf_round=v3")
    assert said == "device.system.mlperf_round: 'v3' is not one of v1.1, v2.0"


def test_per_epoch_costs_weigh_more_as_epochs_shorten():
    """A checkpoint costs the same seconds at any size, so its share of training grows as epochs shorten."""
    shares = []
    for published in calibrate.IN_SAMPLE:
        projection = calibrate.CALIBRATION.project_published(published, Constants())
        shares.append(1 - published.schedule.epochs * projection.steady_epoch_s / projection.training_s)
    assert shares == sorted(shares) and shares[-1] > 3 * shares[0]


@pytest.mark.parametrize("name", ["ipu_pod16", "ipu_pod64", "ipu_pod256", "bow_pod256"])
def test_throughput_per_ipu_falls_as_accumulation_falls(name):
    ipus = system(name).ipus
    per_ipu = []
    for grad_accum in (10, 6, 3, 2, 1):
        step = step_time(resnet50_profile(), system(name), shape(ipus, grad_accum), Constants())
        per_ipu.append(shape(ipus, grad_accum).global_batch / step.total_s / ipus)
    assert per_ipu == sorted(per_ipu, reverse=True) and len(set(per_ipu)) == len(per_ipu)
    assert per_ipu[-1] < 0.95 * per_ipu[0]  # the fixed costs of an update weigh on one micro-batch


def test_pipeline_stages_cost_fill_and_drain():
    pod16, grad_accum = system("ipu_pod16"), 8
    one = step_time(resnet50_profile(), pod16, shape(16, grad_accum), Constants())
    throughput = [shape(16, grad_accum).global_batch / one.total_s]
    for stages in (2, 4):
        piped_shape = shape(16 // stages, grad_accum)
        piped = step_time(split(resnet50_profile(), stages), pod16, piped_shape, Constants())
        assert piped.compute_s == pytest.approx(one.compute_s / stages * (grad_accum + stages - 1) / grad_accum)
        assert piped.exchange_s > 0
        throughput.append(piped_shape.global_batch / piped.total_s)
    assert throughput == sorted(throughput, reverse=True)  # the same 16 IPUs, a longer bubble each time


def test_a_sharded_step_is_the_sum_of_its_stages_with_the_other_ipus_idle():
    pod16, grad_accum, stages = system("ipu_pod16"), 8, 4
    profile = split(resnet50_profile(), stages)
    sharded_shape = shape(4, grad_accum, sharded=True)
    sharded = step_time(profile, pod16, sharded_shape, Constants())
    each = [cost.stage_s(stage, pod16, sharded_shape, Constants()) for stage in profile.stages]
    assert sharded.compute_s == pytest.approx(grad_accum * sum(each))
    assert sharded.exchange_s == pytest.approx(grad_accum * 3 * 2 * 8e6 / pod16.chip.link_bandwidth)
    assert sharded.busy == pytest.approx(1 / stages)  # one IPU of four at a time
    piped = step_time(profile, pod16, shape(4, grad_accum), Constants())
    assert piped.busy == pytest.approx(grad_accum / (grad_accum + stages - 1))
    assert sharded.compute_s > piped.compute_s
    assert step_time(profile, pod16, shape(4, 1, sharded=True), Constants()).compute_s == pytest.approx(sum(each))


def test_host_feed_limit_binds_when_host_cores_are_few():
    pod16 = system("ipu_pod16")
    fed = step_time(resnet50_profile(), pod16, shape(16), Constants())
    assert fed.total_s == fed.device_s > fed.host_feed_s
    starved = step_time(resnet50_profile(), dataclasses.replace(pod16, host_cores=4), shape(16), Constants())
    assert starved.total_s == starved.host_feed_s > starved.device_s


def test_more_ipus_than_the_system_has_are_refused():
    pod16 = system("ipu_pod16")
    with pytest.raises(ValueError, match="17 replicas x 1 IPUs per replica = 17 IPUs, but ipu_pod16 has 16"):
        step_time(resnet50_profile(), pod16, shape(17), Constants())
    with pytest.raises(ValueError, match="= 20 IPUs"):
        step_time(split(resnet50_profile(), 4), pod16, shape(5), Constants())


@pytest.mark.parametrize("published", calibrate.IN_SAMPLE, ids=lambda p: p.system)
def test_the_fit_reproduces_every_in_sample_system_within_3_percent(published):
    constants = calibrate.CALIBRATION.fit(Constants(), calibrate.IN_SAMPLE)
    assert constants is not None
    projection = calibrate.CALIBRATION.project_published(published, constants)
    assert projection.steady_epoch_s == pytest.approx(published.steady_epoch_s, rel=1e-6)  # what the fit matches
    assert projection.throughput_img_s == pytest.approx(published.throughput_img_s, rel=0.03)
    assert projection.time_to_train_min == pytest.approx(published.time_to_train_min, rel=0.03)


def test_default_constants_are_the_calibrated_ones():
    fitted = calibrate.CALIBRATION.fit(Constants(), calibrate.IN_SAMPLE)
    assert fitted is not None
    for name in calibrate.FITTED:
        assert getattr(Constants(), name) == pytest.approx(getattr(fitted, name), rel=1e-3), name
