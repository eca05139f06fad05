"""The simulated IPU system as a run drives it, from config values: the pipeline cut a model must allow, the
memory plan, the clock a training run keeps, and the projection run.mode=project prints."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from backends.ipu_sim import calibrate, cost, pipeline, uncertainty
from backends.ipu_sim.clock import DeviceClock
from backends.ipu_sim.cost import Constants, Projection
from backends.ipu_sim.memory import OutOfMemory
from backends.ipu_sim.plan import Layout, Plan, plan_run
from backends.ipu_sim.uncertainty import Interval
from configs.hardware import System


@dataclass(frozen=True)
class Workload:
    """What a projection times: `epochs` of `train_images`, with `eval_images` evaluated every `eval_every`."""

    epochs: int
    train_images: int
    eval_images: int
    eval_every: int


def check_splits(model: nn.Module, splits: Sequence[str]) -> None:
    """Raise ValueError unless `model` cuts into pipeline stages at `splits`, one tensor crossing each cut."""
    pipeline.cut(model, splits)


def plan(model: nn.Module, layout: Layout, system: System) -> Plan:
    """Probe one micro-batch of `model` on the host and plan each IPU's memory. Raises ValueError for a split
    or recomputation checkpoint the model does not run."""
    return plan_run(model, layout, system.chip)


def clock(planned: Plan, system: System, announce: bool) -> DeviceClock:
    """The system's clock, timed by the cost model, for a run whose memory plan fits: an oversubscribed plan
    raises OutOfMemory (a ValueError) with the per-IPU table, as the IPU compiler refuses it."""
    planned.memory.check()
    if announce:
        print(f"IPU memory of {system.name}: {planned.memory.suggestion()}", flush=True)
    shape = planned.layout.shape()
    step = cost.step_time(planned.profile, system, shape, Constants())
    return DeviceClock(step.total_s, cost.eval_image_s(planned.profile, system, shape, Constants()))


def project(planned: Plan, system: System, workload: Workload) -> str:
    """The system's memory plan, the step time by component, and the projected epoch and time-to-train, with the
    range the assumed constants allow, each corner refitted to POD16 as the central value is; last, one JSON line."""
    pod16 = calibrate.load_system(calibrate.POD16.system)
    refit = calibrate.refitter(calibrate.resnet50_profile(pod16), pod16)
    shape = planned.layout.shape()

    def at(constants: Constants) -> Projection:
        return cost.project(
            planned.profile,
            system,
            shape,
            constants,
            epochs=workload.epochs,
            train_images=workload.train_images,
            eval_images=workload.eval_images,
            eval_every=workload.eval_every,
        )

    central = refit(Constants())
    return report(planned, system, uncertainty.interval(at, refit, central), central, workload.epochs)


def report(planned: Plan, system: System, spread: Interval, central: Constants, epochs: int) -> str:
    """The system, the memory table, the cost model's report and its ranges, and last one JSON line of figures."""
    memory = {"ipu_memory_mb": [round(row.total_mb, 1) for row in planned.memory.rows], "fits": planned.memory.fits}
    hosts = f"{system.hosts} hosts, {system.host_cores} host cores"
    return "\n".join(
        [
            f"{system.name}: {system.ipus} {system.chip.name} IPUs, {hosts}",
            f"{planned.memory.table()}\n{planned.memory.suggestion()}\n",
            cost.report(spread.central, planned.layout.shape(), len(planned.profile.stages), epochs),
            uncertainty.report(spread, central),
            json.dumps(uncertainty.figures(spread) | memory),
        ]
    )


__all__ = ["DeviceClock", "Layout", "OutOfMemory", "Plan", "Workload", "check_splits", "clock", "plan", "project"]
