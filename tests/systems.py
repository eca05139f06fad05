"""The simulated IPU systems of configs/device/, composed by Hydra as a run would, once per test session."""

from __future__ import annotations

from functools import cache

from backends.ipu_sim.calibrate import load_system

system = cache(load_system)  # system("ipu_pod16") -> System
