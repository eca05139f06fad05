"""The simulated TPU slice as a run drives it, from the config: ResNet-50 with plain BatchNorm, each replica's
memory plan against its HBM, and the clock the cost model times (projection/tpu/cost.py). A plan that does not fit
is the user's to fix: a ConfigError."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from backends.base import BackendSection, RunFacts
from backends.clock import DeviceClock
from configs.checks import ConfigError
from configs.schema import Config
from configs.shape import BatchShape
from models import batchnorm, build_resnet50
from monitor.progress import say
from optim.precision import Policy
from projection.probe import matmul_rows, profile_model
from projection.profile import ModelProfile
from projection.tpu import cost, memory
from projection.tpu.backend import TpuSimBackend, build_tpu_sim
from projection.tpu.config import TpuSliceConfig
from projection.tpu.memory import ReplicaMemory

PROBED = 2  # images a probe trains on: BatchNorm needs two values a channel, and below 64 px ResNet's last map is 1x1


def section(cfg: Config) -> TpuSliceConfig:
    """The run's TPU slice section (the registry picked the simulator by its device.name)."""
    assert isinstance(cfg.device, TpuSliceConfig)
    return cfg.device


def build_model(cfg: Config, classes: int) -> nn.Module:
    """ResNet-50 with plain BatchNorm: a group's replicas run each pass as one, so it sees their images together."""
    norm = batchnorm(cfg.model.bn_momentum, cfg.model.bn_eps)
    return build_resnet50(classes, norm, cfg.model.zero_init_residual, section(cfg).channels_last)


def profile(cfg: Config, model: nn.Module) -> ModelProfile:
    """`model` probed on the host at the run's image size, its activations in bf16: PROBED images, whose figures
    the memory plan and the cost model take per image, and its matrix products' rows (the MXUs' fill)."""
    size = cfg.data.image_size
    return replace(profile_model(model, micro_batch=PROBED, image_size=size), matmul_rows=matmul_rows(model, size))


def memory_plan(cfg: Config, shape: BatchShape, probed: ModelProfile, policy: Policy) -> ReplicaMemory:
    """A replica's HBM for the run's micro-batch, refused in one line where it does not fit."""
    device = section(cfg)
    planned = memory.plan(
        probed, device.chosen_chip, device.cores_per_replica, shape.micro_batch, shape.grad_accum, policy.master
    )
    if not planned.fits:
        raise ConfigError("data.global_batch", refusal(planned, shape))
    return planned


def refusal(planned: ReplicaMemory, shape: BatchShape) -> str:
    """Why the plan does not fit, with its figures, and the global batch (or more chips) that would."""
    fits = planned.largest_micro_batch()
    to_do = (
        f"at most {fits} fit, so data.global_batch={fits * shape.grad_accum * shape.replicas} or less, or more"
        " device.chips"
        if fits
        else "not even 8 fit beside the weights and their state"
    )
    return f"TPU out of memory: {planned.micro_batch} images a replica ({planned.where}) need {planned.line()}; {to_do}"


def clock(cfg: Config, shape: BatchShape, probed: ModelProfile) -> DeviceClock:
    """The slice's clock, timed by the cost model: a step, an evaluated image and a host call."""
    device = section(cfg)
    chip, layout = device.chosen_chip, cost.layout_of(device, shape.global_batch)
    times = cost.device_times(probed, chip, layout)
    named = f"{chip.google_name(device.chips)} ({device.chips} TPU {chip.name} chips)"
    return DeviceClock(times.step_s, times.eval_image_s, shape.global_batch, named, device.steps_per_call, times.call_s)


def build_backend(cfg: Config, backend: BackendSection, facts: RunFacts, classes: int) -> TpuSimBackend:
    """The simulated slice's backend around ResNet-50 with plain BatchNorm, once each replica's memory plan fits;
    the main rank says the plan, and the precision a TPU computes where it differs from the one given."""
    model = build_model(cfg, classes)
    probed = profile(cfg, model)
    planned = memory_plan(cfg, facts.shape, probed, facts.policy)
    if facts.topology.is_main:
        say(f"TPU memory of a replica ({planned.where}): {planned.line()}")
        if facts.policy.compute != cfg.precision.compute:
            say(
                f"precision={cfg.precision.name} on a TPU computes as precision={facts.policy.name}: bf16 matmuls"
                " accumulated in fp32, fp32 master weights"
            )
    return build_tpu_sim(backend, facts, model, clock(cfg, facts.shape, probed))
