"""The simulated IPU system as a run drives it, from the config: the layout, the model cut into pipeline stages, the
memory plan, the clock a training run keeps, and the projection run.mode=project prints. A value the system
cannot take (a cut where two tensors cross, an oversubscribed plan) is the user's to fix: a ConfigError."""

from __future__ import annotations

import json

from torch import nn

from backends.ipu_sim import calibrate, cost, pipeline, uncertainty
from backends.ipu_sim.clock import DeviceClock
from backends.ipu_sim.config import System
from backends.ipu_sim.cost import Constants, Projection, Schedule
from backends.ipu_sim.memory import OutOfMemory
from backends.ipu_sim.plan import Layout, Plan, plan_run
from backends.ipu_sim.uncertainty import Interval
from configs.checks import ConfigError
from configs.schema import Config, batch_shape
from models import batchnorm, build_resnet50


def layout(cfg: Config) -> Layout:
    """The run's layout on the simulated IPU system, as the probe, the memory plan and the cost model read it."""
    device = cfg.device
    return Layout(
        replicas=device.replicas,
        micro_batch=batch_shape(cfg, world_size=1).micro_batch,
        grad_accum=cfg.dist.grad_accum,
        image_size=cfg.data.image_size,
        splits=tuple(device.pipeline_splits),
        recompute=device.recompute,
        device_iterations=device.device_iterations,
        optimizer_state=device.optimizer_state,
        input_8bit=device.input_8bit,
        compute=cfg.precision.compute,
        master=cfg.precision.master,
        merged_allreduce=cfg.dist.bucket_mb is None,
    )


def build_model(cfg: Config, classes: int) -> nn.Module:
    """ResNet-50 with plain BatchNorm (a replica group's micro-batches run as one pass, so it sees them together),
    cut into pipeline stages where one tensor crosses each cut."""
    norm = batchnorm(cfg.model.bn_momentum, cfg.model.bn_eps)
    model = build_resnet50(classes, norm, cfg.model.zero_init_residual, cfg.device.channels_last)
    modules = dict(model.named_modules())
    for name in cfg.device.pipeline_splits:
        if name not in modules:
            examples = ", ".join([*list(modules)[1:4], "layer2", "layer3.2"])
            raise ConfigError("device.pipeline_splits", f"{name!r} is not a module of the model (e.g. {examples})")
    try:
        pipeline.cut(model, cfg.device.pipeline_splits)
    except ValueError as err:  # e.g. a cut inside a residual block, where two tensors cross
        raise ConfigError("device.pipeline_splits", str(err)) from err
    return model


def plan(cfg: Config, model: nn.Module) -> Plan:
    """Probe one micro-batch of `model` on the host and plan each IPU's memory."""
    try:
        return plan_run(model, layout(cfg), system_of(cfg).chip)
    except ValueError as err:  # a split or recomputation checkpoint the model does not run
        raise ConfigError("device", str(err)) from err


def clock(cfg: Config, model: nn.Module, announce: bool) -> DeviceClock:
    """The system's clock, timed by the cost model, for a run whose memory plan fits: an oversubscribed plan is
    refused with the per-IPU table, as the IPU compiler refuses it."""
    planned, system = plan(cfg, model), system_of(cfg)
    try:
        planned.memory.check()
    except OutOfMemory as err:
        raise ConfigError("device", str(err)) from err
    if announce:
        print(f"IPU memory of {system.name}: {planned.memory.suggestion()}", flush=True)
    shape = planned.layout.shape()
    step = cost.step_time(planned.profile, system, shape, Constants())
    return DeviceClock(step.total_s, cost.eval_image_s(planned.profile, system, shape, Constants()))


def system_of(cfg: Config) -> System:
    """The simulated system (validation has made sure the config names one)."""
    assert cfg.device.system is not None
    return cfg.device.system


def project(planned: Plan, system: System, schedule: Schedule) -> str:
    """The system's memory plan, the step time by component, and the projected epoch and time-to-train, with the
    range the assumed constants allow, each corner refitted to the in-sample results as the central value is, and
    how far the run reaches beyond them; last, one JSON line."""
    systems = calibrate.in_sample_systems()
    refit = calibrate.refitter(calibrate.resnet50_profile(systems[calibrate.POD16.system]), systems)
    shape = planned.layout.shape(schedule.train_images)

    def at(constants: Constants) -> Projection:
        return cost.project(planned.profile, system, shape, constants, schedule)

    central = refit(Constants())
    assert central is not None, "the central constants must fit the in-sample results"
    spread = uncertainty.interval(at, refit, central)
    return report(planned, system, shape, spread, central, schedule.epochs, beyond_calibration(planned, system, shape))


def beyond_calibration(planned: Plan, system: System, shape: cost.RunShape) -> list[str]:
    """Where the run reaches beyond the in-sample systems (their POD64s, chip, accumulations and host processes,
    and the recipe's 20 images on one IPU per replica); nothing is widened for it beyond the ranges."""
    stages = len(planned.profile.stages)
    samples = {published.system: published.shape for published in calibrate.IN_SAMPLE}
    calibrated = {name: calibrate.load_system(name) for name in samples}
    most_pods = max(cost.pods(calibrated[name], sample, 1) for name, sample in samples.items())
    chips = sorted({chip.chip.name for chip in calibrated.values()})
    accumulations = [sample.grad_accum for sample in samples.values()]
    processes = [cost.instances(sample) for sample in samples.values()]
    beyond = []
    if cost.pods(system, shape, stages) > most_pods:
        spanned = cost.pods(system, shape, stages)
        beyond.append(
            f"{spanned} POD64s (calibrated: up to {most_pods}): the cross-POD phase grows as gateway_growth assumes"
        )
    if system.chip.name not in chips:
        beyond.append(f"chip {system.chip.name} (calibrated: {', '.join(chips)}): per-update costs are taken as theirs")
    if not min(accumulations) <= shape.grad_accum <= max(accumulations):
        beyond.append(
            f"{shape.grad_accum} micro-batches per update (calibrated: {min(accumulations)} to {max(accumulations)})"
        )
    if shape.micro_batch != calibrate.RECIPE.micro_batch or stages > 1:
        beyond.append("a micro-batch or pipeline other than the recipe's (20 images on one IPU)")
    if cost.instances(shape) > max(processes):
        beyond.append(f"{cost.instances(shape)} host processes (calibrated: {min(processes)} to {max(processes)})")
    return beyond


def report(
    planned: Plan,
    system: System,
    shape: cost.RunShape,
    spread: Interval,
    central: Constants,
    epochs: int,
    beyond: list[str],
) -> str:
    """The projected time to train and throughput first, then the system, the memory table, the cost model's
    report and its ranges, where it extrapolates, and last one JSON line of figures."""
    memory = {"ipu_memory_mb": [round(row.total_mb, 1) for row in planned.memory.rows], "fits": planned.memory.fits}
    reach = "within the calibrated regime" if not beyond else "beyond the calibrated regime: " + "; ".join(beyond)
    hosts = f"{system.hosts} hosts, {system.host_cores} host cores"
    return "\n".join(
        [
            uncertainty.headline(spread, epochs) + "\n",
            f"{system.name}: {system.ipus} {system.chip.name} IPUs, {hosts}",
            f"{planned.memory.table()}\n{planned.memory.suggestion()}\n",
            cost.report(spread.central, shape, len(planned.profile.stages), epochs),
            uncertainty.report(spread, central),
            reach,
            json.dumps(uncertainty.figures(spread) | memory | {"beyond_calibration": beyond}),
        ]
    )


__all__ = ["Layout", "Plan", "Schedule", "build_model", "clock", "layout", "plan", "project"]
