"""The simulated IPU systems of configs/device/, composed by Hydra as a run would."""

from __future__ import annotations

from functools import cache

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from backends.ipu_sim.hardware import System
from configs.schema import register


@cache
def system(name: str) -> System:
    """configs/device/<name>.yaml with its chip, e.g. system("ipu_pod16")."""
    register()
    with initialize_config_module("configs", version_base="1.3"):
        cfg = compose("config", overrides=[f"device={name}"])
    return OmegaConf.to_object(cfg.device).system
