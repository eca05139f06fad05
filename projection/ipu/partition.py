"""Where to cut the model into pipeline stages, as Graphcore's tools offered: the candidate cuts listed with what each
would put on the first IPU (device.pipeline_splits=list), and the cuts chosen for a number of IPUs per replica
(device.pipeline_splits=auto), the way TensorFlow's IPU autoshard chose them.

The model is probed once, cut at every candidate point, so each stretch between two points has its own FLOPs,
traffic, parameters and stashed activations. A stage is a run of stretches and costs their sum: the choice tries
every way to cut the stretches into the stages (a few hundred for ResNet-50 on 4 IPUs) and keeps the fastest update
compute and exchange (pipelined: cycles of the slowest stage; sharded: every stage in turn) whose memory plan fits
every IPU.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from projection.ipu import cost, pipeline
from projection.ipu.config import System
from projection.ipu.cost import Constants, RunShape
from projection.ipu.memory import MemoryPlan, in_flight
from projection.ipu.plan import Layout, memory_plan, plan_run
from projection.profile import ModelProfile, StageProfile


class NoFit(ValueError):
    """No cut into the stages asked for fits every IPU's memory."""


@dataclass(frozen=True)
class Stretches:
    """The model probed with a cut at every candidate point: `profile` has one stage per stretch, stretch i + 1
    beginning at `points[i]`."""

    points: tuple[str, ...]
    profile: ModelProfile


def probe_stretches(model: nn.Module, layout: Layout, system: System) -> Stretches:
    points = tuple(pipeline.cut_points(model))
    return Stretches(points, plan_run(model, dataclasses.replace(layout, splits=points), system.chip).profile)


def joined(parts: Sequence[StageProfile]) -> StageProfile:
    """Consecutive stretches as one stage: their costs added, the last one's output passed on."""
    return StageProfile(
        first_module=parts[0].first_module,
        forward_flops=sum(part.forward_flops for part in parts),
        backward_flops=sum(part.backward_flops for part in parts),
        recompute_flops=sum(part.recompute_flops for part in parts),
        memory_bytes=sum(part.memory_bytes for part in parts),
        param_count=sum(part.param_count for part in parts),
        activation_bytes=sum(part.activation_bytes for part in parts),
        recompute_peak_bytes=max(part.recompute_peak_bytes for part in parts),
        output_bytes=parts[-1].output_bytes,
    )


def staged(stretches: Stretches, bounds: Sequence[int]) -> ModelProfile:
    """The profile with stages beginning at the stretches `bounds` (increasing, each in 1 .. stretches - 1)."""
    parts = stretches.profile.stages
    edges = [0, *bounds, len(parts)]
    stages = tuple(joined(parts[start:end]) for start, end in itertools.pairwise(edges))
    return dataclasses.replace(stretches.profile, stages=stages)


def cut_s(profile: ModelProfile, system: System, shape: RunShape) -> float:
    """What the cut decides of an update: its compute and the exchange between stages (pipelined, cycles of the
    slowest stage and the widest exchange; sharded, every stage and boundary in turn)."""
    return cost.compute_s(profile, system, shape, Constants()) + cost.exchanges_s(profile, system, shape)


def choose(stretches: Stretches, stages: int, layout: Layout, system: System) -> tuple[str, ...]:
    """The cuts into `stages` with the fastest compute and exchange among those whose memory fits every IPU (the
    first in order on a tie); NoFit, naming the least overflow and what would help, where none fits."""
    shape = layout.shape()
    candidates = range(1, len(stretches.profile.stages))
    best: tuple[float, tuple[int, ...]] | None = None
    least: tuple[float, MemoryPlan] | None = None
    for bounds in itertools.combinations(candidates, stages - 1):
        profile = staged(stretches, bounds)
        memory = memory_plan(profile, layout, system.chip)
        if memory.fits:
            seconds = cut_s(profile, system, shape)
            best = (seconds, bounds) if best is None or seconds < best[0] else best
        else:
            over = max(row.excess_mb for row in memory.rows)
            least = (over, memory) if least is None or over < least[0] else least
    if best is not None:
        return tuple(stretches.points[bound - 1] for bound in best[1])
    raise NoFit(overflow(stages, least[1] if least else None, len(candidates) + 1))


def overflow(stages: int, closest: MemoryPlan | None, stretches: int) -> str:
    """Why no cut fits: the closest plan's worst IPU and by how much, and what would help."""
    help_ = "more IPUs per replica (device.ipus_per_replica), device.recompute=auto, or a smaller micro-batch"
    if closest is None:
        return f"the model has {stretches} places to cut, too few for {stages} stages: try fewer IPUs per replica"
    worst = max(closest.rows, key=lambda row: row.excess_mb)
    return (
        f"no cut into {stages} stages fits every IPU: at best {worst.name} needs {worst.total_mb:,.0f} MB,"
        f" {worst.excess_mb:,.0f} MB over; try {help_}"
    )


def cut_table(stretches: Stretches, layout: Layout, system: System) -> str:
    """Every candidate cut in order, with what the stretch before it would put on the first IPU of two: its
    compute per micro-batch and its memory (weights, activations in flight, in all)."""
    shape = layout.shape()
    lines = [
        f"candidate cuts for device.pipeline_splits, {layout.micro_batch} images per micro-batch on {system.name}:"
        " what the first IPU would hold if the model were cut there",
        f"  {'cut at':<10}{'GFLOP':>8}{'ms':>8}{'weights MB':>12}{'activations MB':>16}{'IPU total MB':>14}",
    ]
    for bound, point in enumerate(stretches.points, start=1):
        profile = staged(stretches, [bound])
        first, row = profile.stages[0], memory_plan(profile, layout, system.chip).rows[0]
        flops = first.forward_flops + first.backward_flops + first.recompute_flops
        lines.append(
            f"  {point:<10}{flops / 1e9:>8.1f}{1e3 * cost.stage_s(first, system, shape, Constants()):>8.2f}"
            f"{row.weights_mb:>12.1f}{row.activations_mb:>16.1f}{row.total_mb:>14.1f}"
        )
    flight = in_flight(0, 2, layout.grad_accum)
    lines.append(
        f"(activations for {flight} micro-batches in flight; device.pipeline_splits=[a,b,...] pins cuts,"
        " =auto chooses them for device.ipus_per_replica)"
    )
    return "\n".join(lines)
