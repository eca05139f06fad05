"""The simulated IPU system's models: what a model costs in time (cost.py) and memory (memory.py, plan.py) on it, from
a profile of the real model (projection/probe.py); their calibration on Graphcore's published results (calibrate.py),
the ranges its assumptions allow (assumptions.py), and the report run.mode=project prints (report.py).
backends/ipu_sim executes runs on the same system, timed by these models."""
