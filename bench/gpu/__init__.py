"""The one-shot GPU check (`make gpu-check`): every stage in its own process, one table back (bench/gpu/check.py)."""
