"""Google TPU slices, one family's folder: its chips and device section (config.py); the step's cost model (cost.py),
calibrated on Google's published results (calibrate.py); the report run.mode=project prints (report.py); and the
simulated slice a run trains on (simulator.py, backend.py)."""
