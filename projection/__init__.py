"""Projected time-to-train: models of hardware a run does not execute on, calibrated on published results: the
simulated IPU system (ipu/, on Graphcore's) and GPU clusters (gpu/, on NVIDIA's), over a core both share (the run
around the steps, where runs stop, the ranges). run.mode=project (project.py) prints what they project."""
