"""The simulated IPU system as a run drives it, from the config: the layout, the model cut into pipeline stages, the
memory plan and the clock a training run keeps (projection/ipu models them; projection/ipu/report.py projects). A
value the system cannot take (a cut where two tensors cross, an oversubscribed plan) is the user's to fix: a
ConfigError."""

from __future__ import annotations

from torch import nn

from backends.base import BackendSection, RunFacts
from backends.clock import DeviceClock
from configs.checks import ConfigError
from configs.schema import Config
from configs.shape import BatchShape
from models import batchnorm, build_resnet50
from projection.ipu import cost, partition, pipeline
from projection.ipu.backend import IpuSimBackend, build_ipu_sim
from projection.ipu.config import IpuSimConfig, System
from projection.ipu.cost import Constants
from projection.ipu.memory import OutOfMemory
from projection.ipu.plan import Layout, Plan, plan_run


def layout(cfg: Config, shape: BatchShape, splits: tuple[str, ...] = ()) -> Layout:
    """The run's layout on the simulated IPU system cut at `splits`, as the probe, the memory plan and the cost
    model read it."""
    device = section(cfg)
    return Layout(
        replicas=device.replicas,
        micro_batch=shape.micro_batch,
        grad_accum=cfg.dist.grad_accum,
        image_size=cfg.data.image_size,
        splits=splits,
        recompute=device.recompute,
        device_iterations=device.device_iterations,
        optimizer_state=device.optimizer_state,
        input_8bit=device.input_8bit,
        compute=cfg.precision.compute,
        master=cfg.precision.master,
        merged_allreduce=cfg.dist.bucket_mb is None,
        sharded=device.pipeline_mode == "sharded",
    )


def build_model(cfg: Config, classes: int) -> nn.Module:
    """ResNet-50 with plain BatchNorm (a replica group's micro-batches run as one pass, so it sees them together),
    cut into pipeline stages where one tensor crosses each cut."""
    norm = batchnorm(cfg.model.bn_momentum, cfg.model.bn_eps)
    model = build_resnet50(classes, norm, cfg.model.zero_init_residual, section(cfg).channels_last)
    modules = dict(model.named_modules())
    given = section(cfg).explicit_splits() or []
    for name in given:
        if name not in modules:
            examples = ", ".join([*list(modules)[1:4], "layer2", "layer3.2"])
            raise ConfigError("device.pipeline_splits", f"{name!r} is not a module of the model (e.g. {examples})")
    try:
        pipeline.cut(model, given)
    except ValueError as err:  # e.g. a cut inside a residual block, where two tensors cross
        raise ConfigError("device.pipeline_splits", str(err)) from err
    return model


CHOSEN: dict[str, tuple[str, ...]] = {}  # pipeline_splits=auto's cuts by the run's layout: the probe runs once


def splits(cfg: Config, shape: BatchShape, model: nn.Module) -> tuple[str, ...]:
    """The run's cuts: the names device.pipeline_splits gives, or for "auto" the ones partition.choose picks for
    the IPUs per replica, said once so that a user can pin them."""
    given = section(cfg).explicit_splits()
    if given is not None:
        return tuple(given)
    key = repr((cfg.device, cfg.data, cfg.precision, shape))  # all that the cuts depend on
    if key not in CHOSEN:
        stages = section(cfg).pipeline_stages()
        if stages == 1:
            CHOSEN[key] = ()
            print(nothing_to_cut(cfg))
            return CHOSEN[key]
        uncut, system = layout(cfg, shape), system_of(cfg)
        try:
            CHOSEN[key] = partition.choose(partition.probe_stretches(model, uncut, system), stages, uncut, system)
        except partition.NoFit as err:
            raise ConfigError("device.pipeline_splits", str(err)) from err
        pinned = ",".join(CHOSEN[key])
        print(
            f"device.pipeline_splits=auto cut {stages} stages at: [{pinned}] (pin: device.pipeline_splits=[{pinned}])"
        )
    return CHOSEN[key]


def nothing_to_cut(cfg: Config) -> str:
    """Why pipeline_splits=auto leaves a replica whole on one IPU, and what would pipeline it."""
    device, system = section(cfg), system_of(cfg)
    why = (
        "device.ipus_per_replica=1"
        if device.ipus_per_replica is not None
        else f"{device.replicas} replicas over the {system.ipus} IPUs of {system.name}"
    )
    return (
        f"device.pipeline_splits=auto: nothing to cut, one IPU per replica ({why}); to pipeline, give"
        f" device.ipus_per_replica=N with at most {system.ipus}/N device.replicas"
    )


def cut_table(cfg: Config, shape: BatchShape, classes: int) -> str:
    """device.pipeline_splits=list: every place the model can be cut, with what the first IPU would hold."""
    model, uncut, system = build_model(cfg, classes), layout(cfg, shape), system_of(cfg)
    return partition.cut_table(partition.probe_stretches(model, uncut, system), uncut, system)


def plan(cfg: Config, shape: BatchShape, model: nn.Module) -> Plan:
    """Probe one micro-batch of `model` on the host and plan each IPU's memory."""
    cuts = splits(cfg, shape, model)
    try:
        return plan_run(model, layout(cfg, shape, cuts), system_of(cfg).chip)
    except ValueError as err:  # a split or recomputation checkpoint the model does not run
        raise ConfigError("device", str(err)) from err


def clock(cfg: Config, shape: BatchShape, model: nn.Module, announce: bool) -> DeviceClock:
    """The system's clock, timed by the cost model, for a run whose memory plan fits: an oversubscribed plan is
    refused with the per-IPU table, as the IPU compiler refuses it."""
    planned, system = plan(cfg, shape, model), system_of(cfg)
    try:
        planned.memory.check()
    except OutOfMemory as err:
        raise ConfigError("device", str(err)) from err
    if announce:
        print(f"IPU memory of {system.name}: {planned.memory.suggestion()}", flush=True)
    run = planned.layout.shape()  # the cost model's view of the layout
    step_s = cost.step_time(planned.profile, system, run, Constants()).total_s
    eval_image_s = cost.eval_image_s(planned.profile, system, run, Constants())
    named = f"{system.name} ({run.replicas * len(planned.profile.stages)} {system.chip.name} IPUs)"
    return DeviceClock(step_s, eval_image_s, run.global_batch, named)


def section(cfg: Config) -> IpuSimConfig:
    """The run's simulated IPU section (the registry picked the simulator by its device.name)."""
    assert isinstance(cfg.device, IpuSimConfig)
    return cfg.device


def system_of(cfg: Config) -> System:
    """The simulated system (validation has made sure the config names one)."""
    return section(cfg).chosen_system


def listed_cuts(cfg: Config, shape: BatchShape, classes: int) -> str | None:
    """For device.pipeline_splits=list: every place the model can be cut, with what the first IPU would hold (the
    run prints it and does nothing more); None for a run that cuts its model itself."""
    return cut_table(cfg, shape, classes) if section(cfg).pipeline_splits == "list" else None


def build_backend(cfg: Config, backend: BackendSection, facts: RunFacts, classes: int) -> IpuSimBackend:
    """The simulated IPU backend around the model the simulator builds and cuts from the config, with plain
    BatchNorm, once the system's memory plan fits."""
    model = build_model(cfg, classes)
    timed = clock(cfg, facts.shape, model, announce=facts.topology.is_main)
    return build_ipu_sim(backend, facts, model, timed, splits(cfg, facts.shape, model))


__all__ = [
    "Layout",
    "Plan",
    "build_backend",
    "build_model",
    "clock",
    "cut_table",
    "layout",
    "listed_cuts",
    "plan",
    "section",
    "splits",
    "system_of",
]
