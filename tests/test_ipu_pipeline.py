"""Pipelining on the simulated IPU: the grouped schedule's order, and pipelined steps that compute the unpipelined
step's numbers (tiny float64 nets; ResNet-50 at 32 px in float32)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

import pytest
import torch
from torch import nn

from backends.base import StepSettings
from models.resnet import ResNet50, batchnorm, build_resnet50
from optim.precision import Policy
from projection.ipu.backend import IpuSimBackend
from projection.ipu.memory import in_flight
from projection.ipu.pipeline import Event, Pipeline, schedule

REPLICAS, MICRO, STEPS = 2, 2, 3


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny tensors gain nothing from threads, and on a busy shared machine OpenMP's threads wait on each other
    (ResNet-50 at 32 px: 30x slower with two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def net(dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    ).to(dtype)


def ipu_sim(
    model: nn.Module, grad_accum: int, splits: Sequence[str], policy: Policy | None = None, **layout: object
) -> IpuSimBackend:
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    step = StepSettings(label_smoothing=0.1, grad_accum=grad_accum, policy=policy or Policy())
    return IpuSimBackend(model, sgd, torch.device("cpu"), step, replicas=REPLICAS, pipeline_splits=splits, **layout)


def train(backend: IpuSimBackend, shape: tuple[int, ...], steps: int = STEPS) -> dict[str, object]:
    """Weights, running statistics (each group's too) and losses after `steps` updates on seeded batches of
    `shape`: uint8 NHWC images for ResNet-50, random NCHW ones at the model's dtype for the others."""
    g = torch.Generator().manual_seed(1)
    dtype = next(backend.model.parameters()).dtype
    losses = []
    for _ in range(steps):
        if isinstance(backend.model, ResNet50):
            images = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        else:
            images = torch.randn(shape, generator=g, dtype=dtype)
        losses.append(backend.train_step(images, torch.randint(5, shape[:1], generator=g), lr=0.1))
    return {"model": backend.state_dict()["model"], "groups": backend.group_stats, "losses": losses}


def positions(events: list[Event]) -> dict[tuple[int, str, int], int]:
    index = {(e.stage, e.kind, e.micro_batch): i for i, e in enumerate(events)}
    assert len(index) == len(events), "each stage runs each micro-batch's forward and backward once"
    return index


@pytest.mark.parametrize(("stages", "micro_batches"), [(1, 1), (2, 2), (2, 5), (3, 3), (3, 4), (4, 9)])
def test_the_schedule_keeps_every_dependency_and_stashes_what_the_memory_plan_counts(stages, micro_batches):
    events = schedule(stages, micro_batches)
    at = positions(events)
    assert len(at) == 2 * stages * micro_batches
    for m in range(micro_batches):
        for s in range(stages):
            assert at[s, "forward", m] < at[s, "backward", m]
            if s:
                assert at[s - 1, "forward", m] < at[s, "forward", m]
            if s < stages - 1:
                assert at[s + 1, "backward", m] < at[s, "backward", m]
            if m:
                assert at[s, "forward", m - 1] < at[s, "forward", m]
    assert [e.cycle for e in events] == sorted(e.cycle for e in events)
    assert events[-1].cycle == micro_batches - 1 + 2 * (stages - 1)  # ramp-up and ramp-down: 2 (S - 1) cycles
    for s in range(stages):
        stashed, most = 0, 0
        for event in (e for e in events if e.stage == s):
            stashed += 1 if event.kind == "forward" else -1
            most = max(most, stashed)
        assert most == in_flight(s, stages, micro_batches)


@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 1), (3, 2), (4, 3)])
def test_sharded_stages_take_turns_one_micro_batch_at_a_time(stages, micro_batches):
    events = schedule(stages, micro_batches, sharded=True)  # fewer micro-batches than stages: no pipeline to fill
    assert [e.cycle for e in events] == list(range(2 * stages * micro_batches))  # one IPU at work at a time
    up = [(s, "forward") for s in range(stages)] + [(s, "backward") for s in reversed(range(stages))]
    assert [(e.stage, e.kind) for e in events] == up * micro_batches
    assert [e.micro_batch for e in events] == [m for m in range(micro_batches) for _ in up]
    assert all(in_flight(s, stages, micro_batches, sharded=True) == 1 for s in range(stages))


def test_in_the_main_phase_every_stage_runs_one_forward_and_one_backward_per_cycle():
    stages, micro_batches = 3, 8
    events = schedule(stages, micro_batches)
    for cycle in range(2 * (stages - 1), micro_batches):
        work = sorted((e.stage, e.kind) for e in events if e.cycle == cycle)
        assert work == [(s, kind) for s in range(stages) for kind in ("backward", "forward")]


def test_a_pipeline_needs_as_many_micro_batches_as_stages():
    with pytest.raises(ValueError, match="a pipeline of 3 stages needs at least 3"):
        schedule(3, 2)
    with pytest.raises(ValueError, match="a pipeline of 3 stages needs at least 3 micro-batches per update, got 2"):
        ipu_sim(net(), 2, ["3", "6"])


@pytest.mark.parametrize("bn_group", [1, 2])
@pytest.mark.parametrize("splits", [["3"], ["3", "6"]])
def test_pipelined_replicas_train_to_the_unpipelined_weights_and_statistics(bn_group, splits):
    accum = len(splits) + 2
    shape = (REPLICAS * MICRO * accum, 3, 6, 6)
    expected = train(ipu_sim(net(), accum, (), bn_group=bn_group), shape)
    pipelined = train(ipu_sim(net(), accum, splits, bn_group=bn_group), shape)
    torch.testing.assert_close(pipelined, expected, rtol=0, atol=1e-12)
    sharded = train(ipu_sim(net(), accum, splits, bn_group=bn_group, sharded=True), shape)
    torch.testing.assert_close(sharded, expected, rtol=0, atol=1e-12)


def test_the_gradients_are_armed_before_the_last_backward_only():
    backend = ipu_sim(net(), 3, ["3", "6"])
    order: list[str] = []
    backend.gradients.arm = lambda: order.append("arm")
    for name, param in backend.model.named_parameters():
        param.register_post_accumulate_grad_hook(lambda _, name=name: order.append(name))
    train(backend, (REPLICAS * MICRO * 3, 3, 6, 6), steps=1)
    assert order.count("arm") == 1
    stage_0 = ["0.bias", "0.weight", "1.bias", "1.weight"]  # its backward of the last micro-batch comes last
    assert sorted(order[order.index("arm") + 1 :]) == stage_0


def test_a_pipelined_resnet50_trains_to_the_unpipelined_weights():
    def run(splits: list[str]) -> dict[str, object]:
        torch.manual_seed(0)
        model = build_resnet50(5, batchnorm(0.1, 1e-5))
        return train(ipu_sim(model, 3, splits), (REPLICAS * MICRO * 3, 32, 32, 3), steps=2)

    torch.testing.assert_close(run(["layer2", "layer3"]), run([]), rtol=1e-5, atol=1e-6)


def test_a_pipelined_step_under_emulated_fp16_with_16_bit_masters_computes_the_unpipelined_one():
    policy = Policy(
        "fp16.16",
        compute="fp16",
        master="fp16",
        stochastic_rounding=True,
        loss_scaling="static",
        init_scale=128,
        emulated=True,
    )
    shape = (REPLICAS * MICRO * 2, 3, 6, 6)
    expected = train(ipu_sim(net(torch.float32), 2, (), policy=policy), shape)
    pipelined = train(ipu_sim(net(torch.float32), 2, ["3"], policy=policy), shape)
    torch.testing.assert_close(pipelined, expected, rtol=0, atol=0)


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.relu = nn.Conv2d(3, 3, 1), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.relu(self.conv(x))


@pytest.mark.parametrize(
    ("splits", "message"),
    [
        (["block.relu"], "the stage from 'block.relu' takes 2 tensors; a cut must pass exactly one"),
        (["head", "block"], "split 'block' does not start after the previous split"),
        (["block.relu", "block.conv"], "split 'block.conv' does not start after the previous split"),
        (["block"], "split 'block' leaves pipeline stage 0 without a layer"),
        (["tail"], "'tail' is not a module of the model"),
    ],
)
def test_a_split_that_does_not_cut_the_model_in_one_tensor_stages_is_refused(splits, message):
    model = nn.Sequential(OrderedDict(block=Residual(), head=nn.Flatten()))
    with pytest.raises(ValueError, match=message):
        Pipeline(model, splits)
