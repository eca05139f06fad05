"""GPU clusters, one family's folder: its GPUs, clusters and device section (config.py); the step's cost model
(cost.py), calibrated on NVIDIA's published results (calibrate.py); a step make gpu-check measured (measured.py);
and the report run.mode=project prints (report.py)."""
