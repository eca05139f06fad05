"""The hardware families: hardware a run projects onto or simulates, calibrated on published results, one folder
each: the simulated IPU system (ipu/, on Graphcore's) and GPU clusters (gpu/, on NVIDIA's), over a core they share
(the run around the steps, where runs stop, the ranges, the calibration). families.py builds a run's backend through
its device's family; run.mode=project (project.py) prints what a family projects."""
