"""What a run's backend is built from, worked out here once: the run's facts (this rank's device, its precision
policy, the batch shape) and the backend's section of the config, so that the backends never read the whole config.
The device's family (projection/families.py) builds the backend from them."""

from __future__ import annotations

import torch

from backends.base import BackendSection, RunFacts, StepSettings
from backends.native import NativeBackend
from configs.device.native import NativeConfig
from configs.schema import Config
from configs.shape import BatchShape
from distributed import Topology
from optim.precision import Policy


def run_facts(cfg: Config, topology: Topology, shape: BatchShape) -> RunFacts:
    """This rank's device (the CPU, or the GPU of its local rank; a ConfigError where there is none), the precision
    policy as that device runs it, and the batch `shape` over the launch's ranks (configs.schema.validate's)."""
    return facts_on(cfg, topology, NativeBackend.select_device(native_section(cfg), topology.local_rank), shape)


def facts_on(cfg: Config, topology: Topology, device: torch.device, shape: BatchShape) -> RunFacts:
    """The run's facts with its steps on `device` (run_facts picks it; a test may name a GPU that is not there), in
    the precision its device section computes."""
    return RunFacts(topology, device, Policy.for_device(cfg.device.computes(cfg.precision), device.type), shape)


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
