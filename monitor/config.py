"""The progress display's choices (run.progress); configs/schema.py checks the key against them. This module
imports no implementation."""

PROGRESS_MODES = ("auto", "bar", "lines", "none")  # auto: a bar on a terminal, lines otherwise
