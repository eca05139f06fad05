"""Projected time-to-train: models of hardware a run does not execute on (the simulated IPU system today, in ipu/),
calibrated on published results, and run.mode=project (mode.py)."""
