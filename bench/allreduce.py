"""What averaging ResNet-50's gradients over processes costs: bulk buffers against one all_reduce per tensor and DDP.

    python -m bench.allreduce [--nproc 2] [--rounds 5] [--steps 5] [--warmup 1]

Starts NPROC processes joined by gloo over 127.0.0.1, one torch thread each (forked from a fork server that imported
torch once; rank 0's table is printed by this process). Each process holds the 161
parameters of ResNet-50 as the harness builds it (1000 classes, channels_last; 25.6 M values, 102 MB in fp32)
in a trivial module whose forward returns c * sum(p.sum()) for a scalar c (rank + 1): its backward makes
the 161 gradients at little cost, so the figures are the communication plus one fixed, cheap step. Every
variant times the same step, forward, backward and its way of averaging the gradients over the processes:

  baseline    no communication: the step's own cost
  per-tensor  zero_grad(set_to_none=True), then one blocking dist.all_reduce per gradient, each then divided
  bulk        distributed.allreduce.GradientBuckets: zero_(), arm() before the backward, reduce() after it;
              one bucket (the default), then buckets of 1, 4, 25 and 100 MiB with overlap=True (a bucket's
              all_reduce starts during the backward once its gradients are in)
  DDP         torch's DistributedDataParallel with its defaults (25 MiB buckets, gradients copied into them
              and back, overlapped with the backward), zero_grad(set_to_none=True)

Each variant has its own Parameter objects (sharing the values) and so its own gradients. One step of each is
run first and its averaged gradients checked against the exact mean of c over the ranks (a correctness guard).
Then the variants are interleaved step by step, in rounds: each round runs `warmup` untimed steps of each, then
`steps` timed steps of each in the order A B C ..., ... C B A, A B C ... (the next round starts the other way),
so that all see the same machine (its speed drifts by 10-20% over seconds here, and other work on it comes
and goes). Each step is timed on rank 0 between two barriers. A variant's ms per step in a round is the mean
of its steps, and its best round counts (the machine is shared, and interference only ever slows a step
down); the mean over all timed steps is shown beside it. The table gives both and the speed-up over
per-tensor; the last line is JSON, from the best rounds: per_tensor_ms, bulk_ms (one bucket), ddp_ms,
speedup_vs_per_tensor (per_tensor / bulk), ddp_ratio (bulk / DDP), baseline_ms, bulk_<n>mb_ms for each bucket
size, and ddp_ratio_all_steps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from distributed.allreduce import GradientBuckets
from models import batchnorm, build_resnet50

RESNET50_GRADIENTS = 161
BUCKET_MB = (1, 4, 25, 100)


class Gradients(nn.Module):
    """The given tensors as parameters (sharing their values); forward(c) = c * sum(p.sum()), so each p's
    gradient is c everywhere, made by the backward in one pass (no product tensor in the forward)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.params = nn.ParameterList(nn.Parameter(t) for t in tensors)

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return c * torch.stack([p.sum() for p in self.params]).sum()


@dataclass
class Variant:
    name: str
    buckets: str  # the table's column: all_reduces per step (for DDP, its bucket cap)
    step: Callable[[], None]
    grads: Callable[[], list[torch.Tensor]]


def variants(tensors: list[torch.Tensor], c: torch.Tensor, world: int) -> dict[str, Variant]:
    """Each variant's step on its own Gradients module, keyed by its JSON name."""

    def plain(model: Gradients) -> Callable[[], list[torch.Tensor]]:
        return lambda: [p.grad for p in model.params]

    baseline = Gradients(tensors)

    def baseline_step() -> None:
        baseline.zero_grad(set_to_none=True)
        baseline(c).backward()

    per_tensor = Gradients(tensors)

    def per_tensor_step() -> None:
        per_tensor.zero_grad(set_to_none=True)
        per_tensor(c).backward()
        for p in per_tensor.params:
            dist.all_reduce(p.grad)
            p.grad.div_(world)

    def bulk(bucket_mb: float | None, overlap: bool) -> tuple[Callable[[], None], Gradients, GradientBuckets]:
        model = Gradients(tensors)
        buckets = GradientBuckets(list(model.parameters()), bucket_mb=bucket_mb, overlap=overlap)

        def step() -> None:
            buckets.zero_()
            loss = model(c)
            buckets.arm()
            loss.backward()
            buckets.reduce()

        return step, model, buckets

    ddp_module = Gradients(tensors)
    ddp = DistributedDataParallel(ddp_module)

    def ddp_step() -> None:
        ddp.zero_grad(set_to_none=True)
        ddp(c).backward()

    out = {
        "baseline": Variant("baseline", "-", baseline_step, plain(baseline)),
        "per_tensor": Variant("per-tensor", str(len(tensors)), per_tensor_step, plain(per_tensor)),
    }
    for bucket_mb in (None, *BUCKET_MB):
        step, model, buckets = bulk(bucket_mb, overlap=bucket_mb is not None)
        key, name = ("bulk", "bulk") if bucket_mb is None else (f"bulk_{bucket_mb}mb", f"bulk {bucket_mb} MiB")
        out[key] = Variant(name, str(buckets.num_buckets), step, plain(model))
    out["ddp"] = Variant("DDP", "25 MiB", ddp_step, plain(ddp_module))
    return out


def check(variants: dict[str, Variant], world: int) -> None:
    """One step of each variant; every averaged gradient must be the mean of c over the ranks, (world + 1) / 2
    (to rounding: DDP divides before summing)."""
    mean = (world + 1) / 2
    for key, variant in variants.items():
        variant.step()
        if key == "baseline":
            continue
        for g in variant.grads():
            low, high = torch.aminmax(g)
            if not mean * (1 - 1e-6) <= low <= high <= mean * (1 + 1e-6):
                raise AssertionError(f"{variant.name}: gradients in [{low}, {high}], not the mean {mean}")


def timed_rounds(variants: dict[str, Variant], args: argparse.Namespace) -> dict[str, list[float]]:
    """Each variant's ms per step in each round, the variants interleaved step by step (ABBA), each step timed on
    rank 0 between two barriers."""
    ms: dict[str, list[float]] = {key: [] for key in variants}
    for index in range(args.rounds):
        order = list(variants) if index % 2 == 0 else list(reversed(variants))
        for _ in range(args.warmup):
            for key in order:
                variants[key].step()
        elapsed = dict.fromkeys(variants, 0.0)
        for step in range(args.steps):
            for key in order if step % 2 == 0 else reversed(order):
                dist.barrier()
                start = time.perf_counter()
                variants[key].step()
                dist.barrier()
                elapsed[key] += time.perf_counter() - start
        for key in variants:
            ms[key].append(elapsed[key] * 1e3 / args.steps)
    return ms


def rank_main(rank: int, args: argparse.Namespace, port: int, table: str) -> None:
    """One rank: the variants timed; rank 0 writes the table to the file `table`."""
    torch.set_num_threads(1)
    # DDP compares strides exactly, also of size-1 dimensions: a 1x1 conv's gradient (512, 1, 1, 1) against its
    # channels_last bucket view (512, 1, 512, 512) is the same memory layout, yet it warns on every step
    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.nproc, timeout=timedelta(minutes=5)
    )
    try:
        torch.manual_seed(0)
        model = build_resnet50(1000, batchnorm(0.1, 1e-5), channels_last=True)
        tensors = [p.detach() for p in model.parameters()]
        assert len(tensors) == RESNET50_GRADIENTS, len(tensors)
        c = torch.tensor(float(rank + 1))
        runs = variants(tensors, c, args.nproc)
        check(runs, args.nproc)
        ms = timed_rounds(runs, args)
        if rank == 0:
            with open(table, "w") as out, contextlib.redirect_stdout(out):
                report(runs, ms, tensors, args)
    finally:
        dist.destroy_process_group()


def report(
    runs: dict[str, Variant], ms: dict[str, list[float]], tensors: list[torch.Tensor], args: argparse.Namespace
) -> None:
    best = {key: min(values) for key, values in ms.items()}
    mean = {key: sum(values) / len(values) for key, values in ms.items()}
    megabytes = sum(t.numel() * t.element_size() for t in tensors) / 1e6
    print(
        f"ResNet-50's {len(tensors)} gradients ({megabytes:.1f} MB fp32), {args.nproc} processes, gloo, "
        f"1 thread each, torch {torch.__version__}; best of {args.rounds} rounds of {args.steps} steps "
        f"(+{args.warmup} warm-up), variants interleaved step by step\n"
    )
    print(f"{'variant':<14} {'buckets':>8} {'ms/step':>9} {'all steps':>10} {'vs per-tensor':>14}")
    for key, variant in runs.items():
        speedup = best["per_tensor"] / best[key]
        print(f"{variant.name:<14} {variant.buckets:>8} {best[key]:9.1f} {mean[key]:10.1f} {speedup:13.2f}x")
    figures = {
        "per_tensor_ms": round(best["per_tensor"], 2),
        "bulk_ms": round(best["bulk"], 2),
        "ddp_ms": round(best["ddp"], 2),
        "speedup_vs_per_tensor": round(best["per_tensor"] / best["bulk"], 3),
        "ddp_ratio": round(best["bulk"] / best["ddp"], 3),
        "baseline_ms": round(best["baseline"], 2),
        **{f"bulk_{mb}mb_ms": round(best[f"bulk_{mb}mb"], 2) for mb in BUCKET_MB},
        "ddp_ratio_all_steps": round(mean["bulk"] / mean["ddp"], 3),
        "nproc": args.nproc,
    }
    print()
    print(json.dumps(figures), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.allreduce", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2, help="processes (gloo ranks)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant and round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per variant before each round's")
    args = parser.parse_args(argv)
    if args.nproc < 2 or args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("need --nproc >= 2, --rounds >= 1, --steps >= 1, --warmup >= 0")
    mp.set_forkserver_preload(["torch", "torch.distributed"])  # imported once, not by each rank (seconds each)
    with tempfile.TemporaryDirectory() as tmp:
        table = f"{tmp}/table"
        mp.start_processes(rank_main, (args, free_port(), table), nprocs=args.nproc, start_method="forkserver")
        print(Path(table).read_text(), end="", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
