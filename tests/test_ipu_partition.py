"""device.pipeline_splits=list and =auto: the places the model can be cut, and the cuts the simulator chooses,
held against an exhaustive search that probes every cut for real."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

import models
from configs.checks import ConfigError
from configs.schema import batch_shape
from project import listed_cuts
from projection.ipu import partition, pipeline, simulator
from projection.ipu.memory import MB
from projection.ipu.plan import Layout, Plan, plan_run
from tests.conftest import composed, config_error
from tests.systems import system

LAYOUT = Layout(replicas=4, micro_batch=2, grad_accum=8, image_size=32)
SMALL = ("data.image_size=64", "data.eval_resize=73")  # the probe at 64 px: the same cuts, a fraction of the time


def small_resnet() -> models.ResNet50:
    """ResNet-50 with one block a stage: ten stretches, so that every cut can be probed for real in seconds."""
    model = models.build_resnet50(10, models.batchnorm(0.1, 1e-5), channels_last=True)
    for name in ("layer1", "layer2", "layer3", "layer4"):
        setattr(model, name, getattr(model, name)[:1])
    return model


def every_cut(model: models.ResNet50, stages: int) -> dict[tuple[str, ...], Plan]:
    """Each way to cut `model` into `stages` at its cut points, probed and planned for real."""
    chip = system("ipu_pod16").chip
    points = pipeline.cut_points(model)
    return {
        cuts: plan_run(model, dataclasses.replace(LAYOUT, splits=cuts), chip)
        for cuts in itertools.combinations(points, stages - 1)
    }


def fullest_mb(planned: Plan) -> float:
    return max(row.total_mb for row in planned.memory.rows)


def test_the_cut_points_are_where_one_tensor_crosses():
    model = models.build_resnet50(1000, models.batchnorm(0.1, 1e-5), channels_last=True)
    points = pipeline.cut_points(model)
    blocks = [f"layer{i}" + (f".{b}" if b else "") for i, n in enumerate((3, 4, 6, 3), 1) for b in range(n)]
    assert points == ["bn1", "relu", "maxpool", *blocks, "avgpool", "fc"]
    assert "layer1.0.conv2" not in points  # inside a block the residual crosses too
    for point in points:
        assert len(pipeline.cut(model, [point])) == 2


@pytest.mark.parametrize("stages", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3: 8 s of probes
def test_auto_fits_whenever_a_cut_fits_and_its_time_is_within_3_percent_of_the_best(stages):
    model = small_resnet()
    plans = every_cut(model, stages)
    limit_mb = sorted(map(fullest_mb, plans.values()))[len(plans) // 2]  # about half of the cuts fit
    pod = system("ipu_pod16")
    tight = dataclasses.replace(pod, chip=dataclasses.replace(pod.chip, sram_bytes=limit_mb * MB))
    shape = LAYOUT.shape()
    fitting = {cuts: partition.cut_s(p.profile, tight, shape) for cuts, p in plans.items() if fullest_mb(p) <= limit_mb}
    assert fitting and len(fitting) < len(plans)
    chosen = partition.choose(partition.probe_stretches(model, LAYOUT, tight), stages, LAYOUT, tight)
    assert fullest_mb(plans[chosen]) <= limit_mb
    assert fitting[chosen] <= 1.03 * min(fitting.values())


def test_where_no_cut_fits_auto_names_the_overflow_and_what_would_help():
    model = small_resnet()
    least = min(map(fullest_mb, every_cut(model, 2).values()))
    pod = system("ipu_pod16")
    tight = dataclasses.replace(pod, chip=dataclasses.replace(pod.chip, sram_bytes=(least - 1) * MB))
    with pytest.raises(partition.NoFit, match=r"no cut into 2 stages fits every IPU: at best ipu\d .* MB over; try"):
        partition.choose(partition.probe_stretches(model, LAYOUT, tight), 2, LAYOUT, tight)


def test_list_prints_every_cut_point_in_order_with_what_the_first_ipu_holds(capsys):
    cfg = composed("run.mode=project", "experiment=mlperf_pod16", "device.pipeline_splits=list", *SMALL)
    assert listed_cuts(cfg, batch_shape(cfg, 1))
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert rows[0] == ["cut", "at", "GFLOP", "ms", "weights", "MB", "activations", "MB", "IPU", "total", "MB"]
    assert [row[0] for row in rows[1:]][3:7] == ["layer1", "layer1.1", "layer1.2", "layer2"]
    weights = [float(row[3]) for row in rows[1:]]
    assert weights == sorted(weights) and weights[-1] > 40  # the prefixes grow to all but the classifier
    cfg = composed("run.mode=project", "experiment=mlperf_pod16", *SMALL)
    assert not listed_cuts(cfg, batch_shape(cfg, 1))


def test_auto_cuts_the_run_for_its_ipus_per_replica_and_says_where(capsys):
    cfg = composed(
        "run.mode=project",
        "experiment=mlperf_pod16",
        "device.pipeline_splits=auto",
        "device.replicas=4",
        "data.global_batch=800",
        *SMALL,
    )
    shape = batch_shape(cfg, world_size=1)
    model = simulator.build_model(cfg, 1000)
    cuts = simulator.splits(cfg, shape, model)
    assert len(cuts) == 3  # 16 IPUs over 4 replicas
    assert f"device.pipeline_splits=[{','.join(cuts)}]" in capsys.readouterr().out
    assert simulator.plan(cfg, shape, model).memory.fits


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ((), "16 replicas over the 16 IPUs of ipu_pod16"),  # experiment=mlperf_pod16: one IPU each
        (("device.ipus_per_replica=1", "device.replicas=4", "data.global_batch=800"), "device.ipus_per_replica=1"),
    ],
)
def test_auto_on_one_ipu_per_replica_says_there_is_nothing_to_cut_and_what_would_pipeline(overrides, why, capsys):
    cfg = composed("run.mode=project", "experiment=mlperf_pod16", "device.pipeline_splits=auto", *overrides, *SMALL)
    assert simulator.splits(cfg, batch_shape(cfg, world_size=1), simulator.build_model(cfg, 1000)) == ()
    assert capsys.readouterr().out == (
        f"device.pipeline_splits=auto: nothing to cut, one IPU per replica ({why}); to pipeline, give"
        " device.ipus_per_replica=N with at most 16/N device.replicas\n"
    )


def test_auto_and_list_are_the_only_words_and_auto_needs_micro_batches_for_its_stages():
    said = config_error("device=ipu_pod16", "device.pipeline_splits=some")
    assert said == "device.pipeline_splits: 'some' is not one of auto, list"
    refused = ("device=ipu_pod16", "device.pipeline_splits=auto", "device.ipus_per_replica=4", "dist.grad_accum=2")
    assert "a pipeline of 4 stages needs at least 4 micro-batches" in config_error(*refused)
    with pytest.raises(ConfigError):
        composed("device=ipu_pod16", "device.pipeline_splits=auto", "device.ipus_per_replica=0")
    said = config_error("device=ipu_pod16", "device.pipeline_mode=interleaved")
    assert said == "device.pipeline_mode: 'interleaved' is not one of pipelined, sharded"
    turns = ("device.pipeline_splits=[layer2,layer3]", "dist.grad_accum=1", "data.global_batch=8")
    composed("device=ipu_pod16", "device.pipeline_mode=sharded", *turns)  # stages take turns: K may be below S
    assert "a pipeline of 3 stages needs at least 3" in config_error("device=ipu_pod16", *turns)
