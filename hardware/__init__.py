"""The hardware the project runs on or projects onto, as data: IPU chips and systems (ipu.py), GPU clusters (gpu.py)."""
