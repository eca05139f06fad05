"""Optimizers with the MLPerf parameter groups (optimizers.py), the learning-rate schedule (schedule.py), the
precision policy (precision.py), and their config sections (config.py)."""
