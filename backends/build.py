"""The backend of a run, built from its section of the config and the run's facts, both worked out here once: the
backends never read the whole config. The device's family (backends/families.py) picks the class, and with it the
device its steps run on."""

from __future__ import annotations

import torch

from backends.base import Backend, BackendSection, RunFacts, StepSettings
from backends.families import family_of
from configs.device.native import NativeConfig
from configs.schema import Config
from configs.shape import BatchShape
from distributed import Topology
from optim.precision import Policy


def run_facts(cfg: Config, topology: Topology, shape: BatchShape) -> RunFacts:
    """This rank's device (the CPU, or the GPU of its local rank; a ConfigError where there is none), the precision
    policy as that device runs it, and the batch `shape` over the launch's ranks (configs.schema.validate's)."""
    backend = family_of(cfg).backend
    assert backend is not None, f"device={cfg.device.name} is projected onto only (the config's check)"
    return facts_on(cfg, topology, backend.select_device(native_section(cfg), topology.local_rank), shape)


def facts_on(cfg: Config, topology: Topology, device: torch.device, shape: BatchShape) -> RunFacts:
    """The run's facts with its steps on `device` (run_facts picks it; a test may name a GPU that is not there)."""
    return RunFacts(topology, device, Policy.for_device(cfg.precision, device.type), shape)


def from_config(cfg: Config, facts: RunFacts, classes: int) -> Backend:
    """The backend of cfg.device.name for a model of `classes` classes, on this rank's device."""
    build = family_of(cfg).build
    assert build is not None, f"device={cfg.device.name} is projected onto only (the config's check)"
    return build(cfg, section_of(cfg, facts), facts, classes)


def native_section(cfg: Config) -> NativeConfig:
    """The run's device section, which runs its steps natively here (a simulated system's among them)."""
    assert isinstance(cfg.device, NativeConfig), f"device={cfg.device.name} does not run here"
    return cfg.device


def section_of(cfg: Config, facts: RunFacts) -> BackendSection:
    """What a backend reads of the config, with what the run's facts settle: the policy, and device.bn_16bit_input
    (None: on CUDA only)."""
    device = native_section(cfg)
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
