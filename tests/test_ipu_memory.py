"""The probe's figures against direct measurements, and the IPU memory plan's verdicts on real recipes."""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict
from collections.abc import Callable
from itertools import chain

import pytest
import torch
import torch.nn.functional as F
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

import models
from projection.ipu.memory import OutOfMemory, in_flight, plan_memory
from projection.probe import profile_model
from projection.profile import ModelProfile
from tests.systems import system

# Graphcore's MLPerf v1.1 ResNet-50 recipe, per replica: fp16.16, LARS (one momentum slot), 20 x 10, one IPU.
MLPERF = {"master_bytes": 2, "optimizer_slots": 1, "optimizer_state": "on_chip", "grad_accum": 10}


def resnet50() -> models.ResNet50:
    torch.manual_seed(0)
    return models.build_resnet50(1000, models.batchnorm(0.1, 1e-5), zero_init_residual=True, channels_last=True)


@pytest.fixture(scope="module")
def model() -> models.ResNet50:
    return resnet50()


@pytest.fixture(scope="module")
def at_224(model: models.ResNet50) -> dict[str, ModelProfile]:
    """The 224 px probes, one image each (the slow part of this file), shared by the tests that read them."""
    runs = {"none": {}, "auto": {"recompute": "auto"}, "auto, split": {"recompute": "auto", "splits": ["layer1.2"]}}
    return {name: profile_model(model, micro_batch=1, image_size=224, **kwargs) for name, kwargs in runs.items()}


def scaled(profile: ModelProfile, micro_batch: int) -> ModelProfile:
    """The profile at another micro-batch, for plans at batches too large to probe quickly on a CPU: the stashed
    activations are per image (bar BatchNorm's per-channel statistics, a few kB), as a test below checks."""
    k = micro_batch / profile.micro_batch
    stages = tuple(
        dataclasses.replace(s, activation_bytes=s.activation_bytes * k, recompute_peak_bytes=s.recompute_peak_bytes * k)
        for s in profile.stages
    )
    return dataclasses.replace(profile, micro_batch=micro_batch, stages=stages)


class Saved:
    """What autograd saves, grouped by `bucket`: each storage once, floating ones at 2 bytes per element, the
    model's parameters and buffers (and `ignored` tensors) left out."""

    def __init__(self, model: torch.nn.Module, ignored: tuple[torch.Tensor, ...] = ()) -> None:
        self.state = {t.untyped_storage().data_ptr() for t in chain(model.parameters(), model.buffers(), ignored)}
        self.buckets: dict[object, dict[int, int]] = defaultdict(dict)
        self.bucket: object = "forward"

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.state and storage.nbytes():
            per_element = 2 if tensor.is_floating_point() else tensor.element_size()
            self.buckets[self.bucket][storage.data_ptr()] = storage.nbytes() // tensor.element_size() * per_element
        return tensor

    def hooks(self) -> saved_tensors_hooks:
        return saved_tensors_hooks(self.pack, lambda tensor: tensor)

    def bytes(self, bucket: object, without: int | None = None) -> int:
        return sum(size for key, size in self.buckets[bucket].items() if key != without)


def batch(micro_batch: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.randint(0, 256, (micro_batch, size, size, 3), dtype=torch.uint8)
    return images, torch.zeros(micro_batch, dtype=torch.long)


def test_activation_bytes_are_what_a_plain_forward_saves(model):
    profile = profile_model(model, micro_batch=2, image_size=64)
    net = copy.deepcopy(model)
    saved = Saved(net)
    images, labels = batch(2, 64)
    with saved.hooks():
        F.cross_entropy(net(images), labels)
    assert len(profile.stages) == 1
    assert profile.stages[0].activation_bytes == saved.bytes("forward")
    assert profile.stages[0].recompute_peak_bytes == profile.stages[0].recompute_flops == 0


def checkpointed_step(
    net: models.ResNet50, images: torch.Tensor, labels: torch.Tensor, saved: Saved, anchor: torch.Tensor
) -> dict[int, int]:
    """Forward and backward with torch.utils.checkpoint (reentrant: it saves each segment's input and recomputes
    the segment in backward) on the segments recompute="auto" makes: stem and first block, then each further
    Bottleneck; the head (pool, fc, loss) runs plainly, as the plan does not recompute the last segment.
    `anchor`, an input that needs a gradient, makes the first segment (uint8 input) take part in backward.
    Returns each segment's input storage, which its recomputation reads rather than saves."""
    blocks = [block for layer in (net.layer1, net.layer2, net.layer3, net.layer4) for block in layer]

    def stem(x: torch.Tensor) -> torch.Tensor:
        return blocks[0](net.maxpool(net.relu(net.bn1(net.conv1(net.normalize(x))))))

    inputs = {}

    def segment(index: int, run: Callable) -> Callable:
        def recorded(x: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
            if torch.is_grad_enabled():  # recomputing in backward
                saved.bucket, inputs[index] = index, x.untyped_storage().data_ptr()
            return run(x)

        return recorded

    x = images
    for index, run in enumerate([stem, *blocks[1:]]):
        x = checkpoint(segment(index, run), x, anchor, use_reentrant=True)
    saved.bucket = "head"
    loss = F.cross_entropy(net.fc(torch.flatten(net.avgpool(x), 1)), labels)
    loss.backward()
    return inputs


def test_recomputed_activations_are_what_checkpointing_saves(model):
    """Stashed (forward, segments' inputs) = activation_bytes; the head's own saved tensors live until its
    backward; while one segment is recomputed its saved tensors live too: the largest of those = the peak."""
    stage = profile_model(model, micro_batch=2, image_size=64, recompute="auto").stages[0]
    net = copy.deepcopy(model)
    anchor = torch.ones(1, requires_grad=True)
    saved = Saved(net, ignored=(anchor,))
    images, labels = batch(2, 64)
    with saved.hooks():
        inputs = checkpointed_step(net, images, labels, saved, anchor)
    head = saved.bytes("head")
    assert saved.bytes("forward") == pytest.approx(stage.activation_bytes, rel=0.02)
    recomputed = [saved.bytes(index, without=storage) for index, storage in inputs.items()]
    assert len(recomputed) == 16
    assert max([*recomputed, head]) == pytest.approx(stage.recompute_peak_bytes, rel=0.02)
    assert stage.recompute_flops == pytest.approx(stage.forward_flops - 2 * 2 * 2048 * 1000, rel=0.001)


def test_resnet50_flops(at_224):
    """4.1 G multiply-adds per 224 px image forward (2 FLOPs each), and about twice that backward."""
    (stage,) = at_224["none"].stages
    assert stage.forward_flops == pytest.approx(2 * 4.1e9, rel=0.02)
    assert stage.backward_flops == pytest.approx(2 * stage.forward_flops, rel=0.05)
    assert at_224["none"].param_count == 25_557_032
    assert at_224["none"].gradient_tensors == 161


def test_activations_scale_with_the_micro_batch(model):
    one, two = (profile_model(model, micro_batch=b, image_size=32, recompute="auto").stages[0] for b in (2, 4))
    assert two.activation_bytes == pytest.approx(2 * one.activation_bytes, rel=0.01)
    assert two.recompute_peak_bytes == pytest.approx(2 * one.recompute_peak_bytes, rel=0.01)


def test_splits_move_stage_boundaries_not_totals(model):
    whole = profile_model(model, micro_batch=2, image_size=64)
    split = profile_model(model, micro_batch=2, image_size=64, splits=["layer2", "layer3.2"])
    assert [s.first_module for s in split.stages] == ["conv1", "layer2", "layer3.2"]
    for figure in ("forward_flops", "backward_flops", "memory_bytes", "param_count"):
        total = sum(getattr(s, figure) for s in split.stages)
        assert total == pytest.approx(getattr(whole.stages[0], figure), rel=1e-9), figure
    assert split.stages[0].output_bytes == 2 * 256 * 16 * 16 * 2  # layer1's output at fp16
    assert split.stages[-1].output_bytes == 0
    assert split.param_count == whole.param_count
    # each stage's IPU keeps its own copy of a tensor both sides of a boundary save (the block output)
    assert sum(s.activation_bytes for s in split.stages) >= whole.stages[0].activation_bytes


@pytest.mark.parametrize(
    ("splits", "recompute", "named"),
    [(["layer9"], "none", "layer9"), (["layer3", "layer2"], "none", "layer2"), ([], ["layer2.9"], "layer2.9")],
)
def test_bad_split_or_checkpoint_names_are_refused(model, splits, recompute, named):
    with pytest.raises(ValueError, match=rf"'{named}'"):
        profile_model(model, micro_batch=2, image_size=32, splits=splits, recompute=recompute)


def test_probe_leaves_the_model_untouched(model):
    before = copy.deepcopy(model.state_dict())
    profile_model(model, micro_batch=2, image_size=32)
    assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())
    assert all(param.grad is None for param in model.parameters())


def test_grouped_pipeline_in_flight_micro_batches():
    assert [in_flight(stage, 4, grad_accum=10) for stage in range(4)] == [7, 5, 3, 1]
    assert in_flight(0, 1, grad_accum=10) == 1
    assert in_flight(0, 4, grad_accum=4) == 4


def test_sharded_stages_stash_one_micro_batch_each_so_hold_fewer_activations(model):
    profile = profile_model(model, micro_batch=2, image_size=64, splits=["layer2", "layer3", "layer4"])
    plans = {
        sharded: plan_memory(
            profile,
            system("ipu_pod16").chip,
            master_bytes=2,
            optimizer_slots=1,
            optimizer_state="on_chip",
            grad_accum=8,
            sharded=sharded,
        )
        for sharded in (False, True)
    }
    assert [row.micro_batches for row in plans[True].rows] == [1, 1, 1, 1]
    assert [row.micro_batches for row in plans[False].rows] == [7, 5, 3, 1]
    for sharded, piped in zip(plans[True].rows, plans[False].rows, strict=True):
        assert sharded.activations_mb <= piped.activations_mb and sharded.weights_mb == piped.weights_mb
    assert (
        sum(row.activations_mb for row in plans[True].rows) < sum(row.activations_mb for row in plans[False].rows) / 3
    )


def test_mlperf_recipe_fits_a_gc200(at_224):
    """Graphcore's MLPerf v1.1 recipe: 20 images per micro-batch with recomputation on one IPU per replica."""
    plan = plan_memory(scaled(at_224["auto"], 20), system("ipu_pod16").chip, **MLPERF)
    plan.check()
    (row,) = plan.rows
    assert row.limit_mb == 900
    assert row.weights_mb == row.optimizer_mb == pytest.approx(25_557_032 * 2 / 1e6)
    assert row.gradients_mb == pytest.approx(25_557_032 * 4 / 1e6)


def test_too_large_a_micro_batch_is_refused_with_the_table(at_224):
    plan = plan_memory(scaled(at_224["none"], 64), system("ipu_pod16").chip, **MLPERF)
    with pytest.raises(OutOfMemory) as refused:
        plan.check()
    message = str(refused.value)
    (row,) = plan.rows
    assert "limit" in message and "excess" in message and f"{row.excess_mb:.1f}" in message
    assert "900.0" in message and "recompute=auto" in message


def test_recomputation_and_splits_make_a_batch_fit(at_224):
    chip = system("ipu_pod16").chip

    def plan(name: str, micro_batch: int):
        return plan_memory(scaled(at_224[name], micro_batch), chip, **MLPERF)

    assert not plan("none", 20).fits and plan("auto", 20).fits
    assert plan("auto", 64).rows[0].excess_mb < plan("none", 64).rows[0].excess_mb
    one_ipu, two_ipus = plan("auto", 32), plan("auto, split", 32)
    assert not one_ipu.fits and "smaller micro-batch" in one_ipu.suggestion()
    assert two_ipus.fits and [row.micro_batches for row in two_ipus.rows] == [3, 1]


def test_optimizer_state_in_streaming_memory_leaves_the_chip(at_224):
    chip = system("ipu_pod16").chip
    recipe = {**MLPERF, "master_bytes": 4}
    on_chip = plan_memory(scaled(at_224["auto"], 20), chip, **recipe)
    streamed = plan_memory(scaled(at_224["auto"], 20), chip, **{**recipe, "optimizer_state": "streaming"})
    assert on_chip.rows[0].optimizer_mb == pytest.approx(25_557_032 * 4 / 1e6)
    assert streamed.rows[0].optimizer_mb == 0
    assert on_chip.rows[0].weights_mb == pytest.approx(25_557_032 * (2 + 4) / 1e6)  # fp16 copy + fp32 master
