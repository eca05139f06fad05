"""The simulated IPU systems of configs/device/, composed by Hydra as a run would, and ResNet-50 probed as
Graphcore's MLPerf recipe lays it out, each once per test session."""

from __future__ import annotations

from functools import cache

from projection.ipu import calibrate

system = cache(calibrate.load_system)  # system("ipu_pod16") -> System


resnet50_profile = calibrate.resnet50_profile  # probed once per process
