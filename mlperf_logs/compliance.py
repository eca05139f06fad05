"""mlperf_logging's compliance checker, run in this process on one log, its complaints read back as text."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from mlperf_logging.compliance_checker import mlp_compliance

USAGE, RULESET = "training", "4.0.0"  # ResNet's last training ruleset


def complaints(log: Path) -> list[str]:
    """What the checker finds wrong with `log`, one line each; empty when it passes."""
    mlp_compliance.enqueued_configs.clear()  # a module-level queue that an interrupted check can leave filled
    checker = mlp_compliance.make_checker(USAGE, RULESET, quiet=True, werror=False)
    with root_handlers(logging.NullHandler()):
        try:
            valid = checker.check_file(str(log), f"{USAGE}_{RULESET}/common.yaml")
        except Exception as err:  # its rules eval the logged values; a damaged value can raise outside their guard
            return [f"the checker stopped: {err!r}"]
    messages = [*checker.overwritable.values(), *checker.not_overwritable]
    return [] if valid else [" ".join(str(message).split()) for message in messages] or ["invalid log"]


@contextlib.contextmanager
def root_handlers(*handlers: logging.Handler) -> Iterator[None]:
    """mlperf_logging reports through the root logger (and its module-level calls install a stderr handler on a
    root that has none): while it runs in-process, `handlers` alone receive its records."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers[:] = handlers
    try:
        yield
    finally:
        root.handlers[:] = saved
