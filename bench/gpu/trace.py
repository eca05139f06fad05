"""Stage `trace`: where the GPU's time goes in the best step, from a CUDA trace of it.

The best step (bench.gpu.step.best_known: compiled, and captured in a CUDA graph where its settings say so) at the
step stage's batch, on a batch already on the GPU, warmed up (compiled, captured, cuDNN's autotuner done), then
STEPS steps under torch.profiler with the CPU and CUDA activities. From the device's events (kernels, copies and
fills; not annotations):

  top          the TOP activities by total device time: the name (truncated), ms per step and share of the step's
               wall time
  busy, idle   per step: the union of the device's activities (the GPU busy) against the wall time of a step (the
               host's clock over the traced steps, the device drained at the end); what is left is the GPU idle,
               waiting for the host or between kernels

Where the profiler sees no kernel in a replayed CUDA graph, the step is traced again without the graph (said under
"graphs"). In the rehearsal (no CUDA) the same analysis runs over the CPU's aten operators, which says nothing of
a GPU (marked so).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from bench.gpu import stage
from bench.gpu import step as step_stage

STEPS = {False: 5, True: 2}  # traced steps (full, tiny)
TOP = 10
NAME_CHARS = 90


@dataclass(frozen=True)
class Span:
    """One activity on the device's timeline, in microseconds."""

    name: str
    start_us: float
    end_us: float


def busy_us(spans: list[Span]) -> float:
    """The time covered by at least one span (overlapping kernels on several streams count once)."""
    covered, end = 0.0, float("-inf")
    for span in sorted(spans, key=lambda s: s.start_us):
        if span.end_us > end:
            covered += span.end_us - max(span.start_us, end)
            end = span.end_us
    return covered


def figures_of(spans: list[Span], steps: int, wall_s: float, top: int = TOP) -> stage.Figures:
    """The top activities by total time, and the busy and idle time, each per step, from `spans` over `steps`
    steps that took `wall_s` seconds."""
    totals: dict[str, float] = defaultdict(float)
    for span in spans:
        totals[span.name] += span.end_us - span.start_us
    wall_ms = wall_s * 1000 / steps
    busy_ms = busy_us(spans) / 1000 / steps
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:top]
    return {
        "steps": steps,
        "wall_ms_per_step": round(wall_ms, 3),
        "busy_ms_per_step": round(busy_ms, 3),
        "idle_ms_per_step": round(max(wall_ms - busy_ms, 0.0), 3),
        "busy_share": round(busy_ms / wall_ms, 3) if wall_ms else None,
        "activities_per_step": round(len(spans) / steps, 1),
        "top": [
            {
                "name": name[:NAME_CHARS],
                "ms_per_step": round(total / 1000 / steps, 3),
                "share": round(total / 1000 / steps / wall_ms, 3) if wall_ms else None,
            }
            for name, total in ranked
        ],
    }


def device_spans(prof: profile, on_gpu: bool) -> list[Span]:
    """The traced activities of the device (CUDA's kernels, copies and fills), or in the rehearsal the CPU's aten
    operators."""
    wanted = DeviceType.CUDA if on_gpu else DeviceType.CPU
    return [
        Span(event.name, event.time_range.start, event.time_range.end)
        for event in prof.events()
        if event.device_type == wanted and not event.is_user_annotation and (on_gpu or event.name.startswith("aten::"))
    ]


def traced(overrides: list[str], sizes: stage.Sizes, steps: int) -> tuple[list[Span], float]:
    """The step built from `overrides`, warmed up, then `steps` of it traced: its device's spans, and the wall
    seconds they took."""
    on_gpu = torch.cuda.is_available()
    images, labels = step_stage.inputs(sizes)
    train_step, _ = step_stage.harness(overrides, sizes, images, labels)
    for _ in range(sizes.warmup):
        train_step()
    stage.synchronize()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            train_step()
        stage.synchronize()
        wall_s = time.perf_counter() - started
    return device_spans(prof, on_gpu), wall_s


def run(args: argparse.Namespace, sizes: stage.Sizes) -> stage.Figures:
    torch.backends.cudnn.benchmark = True
    overrides = step_stage.best_known(args.work)
    steps = STEPS[args.tiny]
    figures: stage.Figures = {"batch": sizes.batch, "image": sizes.image, "overrides": " ".join(overrides)}
    if not torch.cuda.is_available():
        figures["gpu"] = stage.no_gpu("a CUDA trace (the rehearsal traces the CPU's aten operators)")

    def trace() -> stage.Figures:
        spans, wall_s = traced(overrides, sizes, steps)
        if not spans and torch.cuda.is_available() and "device.cuda_graphs=false" not in overrides:
            step_stage.fresh()
            again = [o for o in overrides if not o.startswith("device.cuda_graphs=")] + ["device.cuda_graphs=false"]
            figures["graphs"] = "off: the profiler saw no kernel of the replayed CUDA graph; traced without it"
            spans, wall_s = traced(again, sizes, steps)
        return figures_of(spans, steps, wall_s)

    stage.attempt("trace", trace, figures, args.json)
    return figures


if __name__ == "__main__":
    sys.exit(stage.main(run))
