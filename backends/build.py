"""The backend of a run, built from its section of the config and the run's facts, both worked out here once: the
backends never read the whole config. The device name picks the class, and with it the device its steps run on."""

from __future__ import annotations

import torch

from backends.base import Backend, BackendSection, RunFacts, StepSettings
from backends.config import simulated
from backends.ipu_sim import simulator
from backends.ipu_sim.backend import IpuSimBackend, build_ipu_sim
from backends.native import NativeBackend, build_native
from configs.schema import Config
from configs.shape import BatchShape
from distributed import Topology
from optim.precision import Policy

BACKENDS: dict[str, type[NativeBackend]] = {"cpu": NativeBackend, "cuda": NativeBackend, "ipu_sim": IpuSimBackend}


def run_facts(cfg: Config, topology: Topology, shape: BatchShape) -> RunFacts:
    """This rank's device (the CPU, or the GPU of its local rank; a ConfigError where there is none), the precision
    policy as that device runs it, and the batch `shape` over the launch's ranks (configs.schema.validate's)."""
    return facts_on(cfg, topology, BACKENDS[cfg.device.name].select_device(cfg.device, topology.local_rank), shape)


def facts_on(cfg: Config, topology: Topology, device: torch.device, shape: BatchShape) -> RunFacts:
    """The run's facts with its steps on `device` (run_facts picks it; a test may name a GPU that is not there)."""
    return RunFacts(topology, device, Policy.for_device(cfg.precision, device.type), shape)


def from_config(cfg: Config, facts: RunFacts, classes: int) -> Backend:
    """The backend of cfg.device.name for a model of `classes` classes, on this rank's device."""
    section = section_of(cfg, facts)
    if simulated(cfg.device):
        return on_simulated_system(cfg, section, facts, classes)
    return build_native(section, facts, classes)


def section_of(cfg: Config, facts: RunFacts) -> BackendSection:
    """What a backend reads of the config, with what the run's facts settle: the policy, and device.bn_16bit_input
    (None: on CUDA only)."""
    device = cfg.device
    step = StepSettings(
        label_smoothing=cfg.optim.label_smoothing,
        policy=facts.policy,
        grad_accum=cfg.dist.grad_accum,
        seed=cfg.run.seed * 1_000_003,  # one rounding stream on every rank: replicas keep identical weights
        bucket_mb=cfg.dist.bucket_mb,
        overlap=cfg.dist.overlap,
        batchnorm_16bit=facts.device.type == "cuda" if device.bn_16bit_input is None else device.bn_16bit_input,
        compiled=device.compile,
        cuda_graphs=device.cuda_graphs,
    )
    return BackendSection(cfg.model, cfg.optim, device, cfg.dist.bn_group_size, step)


def on_simulated_system(cfg: Config, section: BackendSection, facts: RunFacts, classes: int) -> IpuSimBackend:
    """The simulated IPU backend around the model the simulator builds and cuts from the config, with plain
    BatchNorm, once the system's memory plan fits."""
    model = simulator.build_model(cfg, classes)
    clock = simulator.clock(cfg, facts.shape, model, announce=facts.topology.is_main)
    return build_ipu_sim(section, facts, model, clock, simulator.splits(cfg, facts.shape, model))
