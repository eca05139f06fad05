"""The simulated IPU system, one family's folder: its chips, systems and device section (config.py); what a model
costs in time (cost.py) and memory (memory.py, plan.py) on it, from a profile of the real model (projection/probe.py);
their calibration on Graphcore's published results (calibrate.py), the ranges its assumptions allow (assumptions.py)
and the report run.mode=project prints (report.py); and the simulated backend that executes runs on the same
system (simulator.py, backend.py, pipeline.py, partition.py), timed by these models (clock.py)."""
