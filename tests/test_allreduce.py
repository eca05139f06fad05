"""Bulk gradient all-reduce: gradients as views of flat buffers, and their average over two gloo ranks.

The two-rank scenarios run in one spawn (a module-scoped fixture: each spawn costs seconds of imports); each
scenario's outcome, or its traceback, is checked by its own test.
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from bench import allreduce as allreduce_bench
from distributed.allreduce import MB, GradientBuckets
from tests.ranks import run_ranks

TINY_MB = 2048 / MB  # 2 KiB: the test net's float64 gradients span several buckets
WORLD = 2
MICRO, MICRO_BATCHES = 4, 3


class Net(nn.Module):
    """Two convolutions and a linear head, channels_last, in float64 so that averages compare exactly."""

    def __init__(self, seed: int = 0, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16, 5)
        self.to(dtype=dtype, memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc(x.mean((2, 3)))


class Mixed(nn.Module):
    """Parameters of three dtypes; the gradient of each is `weight` (drawn per rank), in the parameter's dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.f64 = nn.Parameter(torch.zeros(6, dtype=torch.float64))
        self.f16 = nn.Parameter(torch.zeros(6, dtype=torch.float16))
        self.bf16 = nn.Parameter(torch.zeros(6, dtype=torch.bfloat16))

    def loss(self, rank: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(rank)
        return sum((p * torch.randn(6, generator=generator).to(p.dtype)).sum().double() for p in self.parameters())


def batch(rank: int, size: int, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + rank)
    images = torch.randn(size, 3, 6, 6, generator=generator, dtype=dtype).contiguous(memory_format=torch.channels_last)
    return images, torch.randint(0, 5, (size,), generator=generator)


def loss_of(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, total: int) -> torch.Tensor:
    """Summed over the samples and divided by the whole update's batch, so micro-batch losses add up to its mean."""
    return F.cross_entropy(model(images), labels, reduction="sum") / total


def grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


class CountedAllReduce:
    """Stands in for dist.all_reduce in a rank process, counting calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._all_reduce = dist.all_reduce
        dist.all_reduce = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self._all_reduce(*args, **kwargs)


# Two-rank scenarios: each a function of the rank and a call counter, returning what the tests check.

CONFIGS = {
    "one bucket": {},
    "tiny buckets": {"bucket_mb": TINY_MB},
    "overlap, tiny buckets": {"bucket_mb": TINY_MB, "overlap": True},
    "overlap, one bucket": {"overlap": True},
}


def one_update(model: nn.Module, buckets: GradientBuckets, rank: int, counter: CountedAllReduce) -> int:
    """One armed backward and reduce(); returns the all_reduce calls made during backward."""
    counter.calls = 0
    buckets.zero_()
    buckets.arm()
    loss_of(model, *batch(rank, MICRO), MICRO).backward()
    during_backward = counter.calls
    buckets.reduce()
    return during_backward


def averaged(rank: int, counter: CountedAllReduce) -> dict[str, Any]:
    """Each configuration's reduced gradients; this rank's own come from a twin without buckets (with overlap,
    the buffers may already hold the sum when backward returns)."""
    reference = Net()
    loss_of(reference, *batch(rank, MICRO), MICRO).backward()
    out: dict[str, Any] = {"local": grads(reference)}
    for name, kwargs in CONFIGS.items():
        model = Net()
        buckets = GradientBuckets(list(model.parameters()), **kwargs)
        views = [p.grad for p in model.parameters()]
        during_backward = one_update(model, buckets, rank, counter)
        out[name] = {
            "reduced": grads(model),
            "buckets": buckets.num_buckets,
            "during_backward": during_backward,
            "calls": counter.calls,
            "views_kept": all(p.grad is view for p, view in zip(model.parameters(), views, strict=True)),
            "strides_kept": all(p.grad.stride() == p.stride() for p in model.parameters()),
            "waited_s": buckets.waited.seconds,
        }
    return out


def accumulated(rank: int, counter: CountedAllReduce) -> dict[str, Any]:
    """Two weight updates of MICRO_BATCHES micro-batches each, against one big-batch backward per rank."""
    big = MICRO * MICRO_BATCHES
    reference = Net()
    loss_of(reference, *batch(rank, big), big).backward()
    out: dict[str, Any] = {"big_batch": grads(reference)}
    for overlap in (False, True):
        model = Net()
        buckets = GradientBuckets(list(model.parameters()), bucket_mb=TINY_MB, overlap=overlap)
        images, labels = batch(rank, big)
        counter.calls = 0
        after_each: list[int] = []
        for _ in range(2):
            buckets.zero_()
            for k in range(MICRO_BATCHES):
                if k == MICRO_BATCHES - 1:
                    buckets.arm()
                part = slice(k * MICRO, (k + 1) * MICRO)
                loss_of(model, images[part], labels[part], big).backward()
                after_each.append(counter.calls)
            buckets.reduce()
        out[f"overlap={overlap}"] = {
            "reduced": grads(model),
            "buckets": buckets.num_buckets,
            "after_each": after_each,
            "calls": counter.calls,
        }
    return out


def unused(rank: int, counter: CountedAllReduce) -> dict[str, Any]:
    """With overlap, a parameter the backward never reaches, last in the list (so in the first bucket): no bucket
    may be launched before it (every rank launches in bucket order), so reduce() launches them all."""
    model = Net()
    model.unused = nn.Parameter(torch.ones(3, dtype=torch.float64))  # first in model.parameters()
    buckets = GradientBuckets([*list(model.parameters())[1:], model.unused], bucket_mb=TINY_MB, overlap=True)
    during_backward = one_update(model, buckets, rank, counter)
    return {
        "reduced": grads(model)[1:],
        "unused": model.unused.grad.clone(),
        "buckets": buckets.num_buckets,
        "during_backward": during_backward,
        "calls": counter.calls,
    }


def dtypes(rank: int, counter: CountedAllReduce) -> dict[str, Any]:
    model = Mixed()
    buckets = GradientBuckets(list(model.parameters()))
    buckets.zero_()
    model.loss(rank).backward()
    local = grads(model)
    buckets.reduce()
    return {"local": local, "reduced": grads(model), "buffer_dtypes": [b.dtype for b in buckets.buffers]}


def non_finite(rank: int, counter: CountedAllReduce) -> dict[str, torch.Tensor]:
    """Rank 0's loss has a term whose gradient is inf for one weight of the head (through backward, as overlap
    launches buckets during it)."""
    model = Net(dtype=torch.float32)
    buckets = GradientBuckets(list(model.parameters()), bucket_mb=TINY_MB, overlap=True)
    buckets.zero_()
    buckets.arm()
    loss = loss_of(model, *batch(rank, MICRO, torch.float32), MICRO)
    if rank == 0:
        loss = loss + model.fc.weight[1, 2] * math.inf
    loss.backward()
    buckets.reduce()
    return {name: torch.isfinite(p.grad) for name, p in model.named_parameters()}


SCENARIOS: dict[str, Callable[[int, CountedAllReduce], Any]] = {
    "averaged": averaged,
    "accumulated": accumulated,
    "unused": unused,
    "dtypes": dtypes,
    "non_finite": non_finite,
}


def run_scenarios(rank: int, world_size: int) -> dict[str, Any]:
    """On each rank: every scenario, with its result or its traceback (so one failure fails one test)."""
    counter = CountedAllReduce()
    out = {}
    for name, scenario in SCENARIOS.items():
        try:
            out[name] = scenario(rank, counter)
        except Exception:
            out[name] = traceback.format_exc()
    return out


@pytest.fixture(scope="module")
def ranked() -> Callable[[str], list[Any]]:
    results = run_ranks(run_scenarios, WORLD)

    def scenario(name: str) -> list[Any]:
        for rank, result in enumerate(results):
            if isinstance(result[name], str):
                pytest.fail(f"rank {rank}, scenario {name}:\n{result[name]}")
        return [result[name] for result in results]

    return scenario


def mean(per_rank: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [sum(tensors) / len(tensors) for tensors in zip(*per_rank, strict=True)]


def assert_equal(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


@pytest.mark.parametrize("config", CONFIGS)
def test_the_time_reduce_waits_is_counted_for_the_epochs_time_split(ranked, config):
    """What the epoch line and metrics.csv report as the all-reduce's share of the time."""
    for result in ranked("averaged"):
        assert 0 < result[config]["waited_s"] < 60


@pytest.mark.parametrize("config", CONFIGS)
def test_reduce_averages_each_gradient_over_the_ranks(ranked, config):
    results = ranked("averaged")
    expected = mean([result["local"] for result in results])
    per_rank = [result[config] for result in results]
    for r in per_rank:
        assert_equal(r["reduced"], expected)  # float64, two ranks: (a + b) / 2 either way, to the bit
        assert r["views_kept"] and r["strides_kept"]
        assert r["calls"] == r["buckets"]
    assert (per_rank[0]["buckets"] > 2) == ("tiny" in config)
    # overlap: every bucket is launched by the backward's hooks; without it, by reduce()
    assert per_rank[0]["during_backward"] == (per_rank[0]["buckets"] if "overlap" in config else 0)


def test_with_overlap_buckets_are_launched_in_order_behind_an_unused_parameter(ranked):
    expected = mean([result["local"] for result in ranked("averaged")])
    for r in ranked("unused"):
        assert_equal(r["reduced"], expected)
        assert not r["unused"].any()
        assert r["during_backward"] == 0 and r["calls"] == r["buckets"] > 2


@pytest.mark.parametrize("overlap", [False, True])
def test_accumulated_micro_batches_reduce_once_per_update_to_the_big_batch_average(ranked, overlap):
    per_rank = ranked("accumulated")
    expected = mean([r["big_batch"] for r in per_rank])
    for r in per_rank:
        update = r[f"overlap={overlap}"]
        for actual, wanted in zip(update["reduced"], expected, strict=True):
            torch.testing.assert_close(actual, wanted)  # the micro-batches sum in another order
        n = update["buckets"]
        assert update["calls"] == 2 * n  # two updates, one all_reduce per bucket each
        launched = [0, 0, n, n, n, 2 * n] if overlap else [0, 0, 0, n, n, n]
        assert update["after_each"] == launched  # only the armed (last) backward launches


def test_reduce_keeps_each_dtype_in_its_own_bucket(ranked):
    per_rank = ranked("dtypes")
    expected = mean([r["local"] for r in per_rank])  # in each dtype: a + b rounded, then halved
    for r in per_rank:
        assert r["buffer_dtypes"] == [torch.bfloat16, torch.float16, torch.float64]  # reverse parameter order
        assert [g.dtype for g in r["reduced"]] == [torch.float64, torch.float16, torch.bfloat16]
        assert_equal(r["reduced"], expected)


def test_a_non_finite_gradient_on_one_rank_is_non_finite_on_every_rank(ranked):
    for finite in ranked("non_finite"):
        for name, mask in finite.items():
            if name == "fc.weight":
                assert not mask[1, 2] and mask.sum() == mask.numel() - 1
            else:
                assert mask.all(), name


# One process, no process group.


def test_gradients_are_views_of_the_buffers_written_in_place():
    model, reference = Net(), Net()
    buckets = GradientBuckets(list(model.parameters()), bucket_mb=TINY_MB)
    views = [p.grad for p in model.parameters()]
    storages = {b.untyped_storage().data_ptr() for b in buckets.buffers}
    for _ in range(2):  # the second backward accumulates into the same views
        loss_of(model, *batch(0, MICRO), MICRO).backward()
        loss_of(reference, *batch(0, MICRO), MICRO).backward()
    for p, view, ref in zip(model.parameters(), views, reference.parameters(), strict=True):
        assert p.grad is view and p.grad.untyped_storage().data_ptr() in storages
        torch.testing.assert_close(p.grad, ref.grad)
    assert math.isclose(
        sum(b.sum().item() for b in buckets.buffers), sum(p.grad.sum().item() for p in reference.parameters())
    )
    buckets.buffers[0].fill_(7.0)
    assert any(bool((p.grad == 7.0).all()) for p in model.parameters())


def test_channels_last_parameters_keep_their_strides():
    model = Net()
    GradientBuckets(list(model.parameters()))
    for p in (model.conv1.weight, model.conv2.weight):
        assert not p.is_contiguous() and p.is_contiguous(memory_format=torch.channels_last)
    assert all(p.grad.stride() == p.stride() for p in model.parameters())


def test_a_parameter_that_is_not_dense_is_refused():
    strided = nn.Parameter(torch.zeros(4, 6)[:, ::2])
    with pytest.raises(ValueError, match="not dense"):
        GradientBuckets([strided])


def test_buckets_fill_in_reverse_order_up_to_the_size_and_never_mix_dtypes():
    model = Net()
    params = list(model.parameters())
    limit = TINY_MB * MB
    buckets = GradientBuckets(params, bucket_mb=TINY_MB)
    sizes = [p.numel() * p.element_size() for p in params]
    assert sum(buckets.bucket_bytes) == sum(sizes)
    assert all(b <= limit or b in sizes for b in buckets.bucket_bytes)  # only a parameter alone exceeds it
    first = buckets.buffers[0].untyped_storage().data_ptr()
    assert params[-1].grad.untyped_storage().data_ptr() == first  # the last parameter's gradient comes first
    assert GradientBuckets(list(Net().parameters())).num_buckets == 1
    mixed = GradientBuckets(list(Mixed().parameters()))
    assert mixed.num_buckets == 3 and len({b.dtype for b in mixed.buffers}) == 3


def test_frozen_parameters_are_skipped():
    model = Net()
    model.fc.requires_grad_(False)
    buckets = GradientBuckets(list(model.parameters()))
    assert model.fc.weight.grad is None
    assert buckets.bucket_bytes == [sum(p.numel() * 8 for p in model.parameters() if p.requires_grad)]


def test_zero_zeroes_the_gradients_and_restores_replaced_views():
    model = Net()
    buckets = GradientBuckets(list(model.parameters()), bucket_mb=TINY_MB)
    views = [p.grad for p in model.parameters()]
    loss_of(model, *batch(0, MICRO), MICRO).backward()
    model.conv1.weight.grad = None  # as optimizer.zero_grad(set_to_none=True) would
    model.fc.bias.grad = torch.ones_like(model.fc.bias)
    buckets.zero_()
    assert all(p.grad is view for p, view in zip(model.parameters(), views, strict=True))
    assert all(bool((b == 0).all()) for b in buckets.buffers)
    reference = Net()
    loss_of(model, *batch(0, MICRO), MICRO).backward()
    loss_of(reference, *batch(0, MICRO), MICRO).backward()
    for p, ref in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, ref.grad)


def test_reduce_does_nothing_in_one_process(monkeypatch):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("all_reduce called in one process")

    monkeypatch.setattr(dist, "all_reduce", refuse)
    for group_of_one in (False, True):
        if group_of_one:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            model = Net()
            buckets = GradientBuckets(list(model.parameters()), overlap=True)
            buckets.arm()
            loss_of(model, *batch(0, MICRO), MICRO).backward()
            before = grads(model)
            buckets.reduce()
            assert_equal(grads(model), before)
        finally:
            if group_of_one:
                dist.destroy_process_group()


@pytest.mark.slow  # 5 s of ranks; the all-reduce it times is checked above
def test_bench_prints_its_table_then_the_figures_as_json(capfd):
    """`python -m bench.allreduce`'s main, here (its ranks are processes of its own; rank 0 prints)."""
    assert allreduce_bench.main(["--nproc", "2", "--rounds", "1", "--steps", "1", "--warmup", "0"]) == 0
    lines = capfd.readouterr().out.strip().splitlines()
    figures = json.loads(lines[-1])
    for key in ("per_tensor_ms", "bulk_ms", "ddp_ms", "baseline_ms", "speedup_vs_per_tensor", "ddp_ratio"):
        assert figures[key] > 0
    assert math.isclose(figures["speedup_vs_per_tensor"], figures["per_tensor_ms"] / figures["bulk_ms"], rel_tol=0.01)
    assert any(line.startswith("per-tensor") for line in lines) and any(line.startswith("DDP") for line in lines)
