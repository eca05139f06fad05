"""Benchmarks: each `python -m bench.<name>` measures the harness against a named peer in the same run,
prints a table and, last, one JSON line of figures."""
