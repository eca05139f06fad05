"""The MLPerf log of a run: mllog lines in a file, written by rank 0 only, naming the real call sites."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlperf_logging.mllog import constants, mllog

import rundir

REPO_ROOT = Path(__file__).resolve().parent.parent
# A resumed run says so in its log. MLPerf's training rules (training_rules.adoc, "Run Results") time a run over
# one contiguous period and say "The clock may not be paused during the run": a resumed log keeps its run_start,
# so its time to train includes the time it was stopped, and this event (the checker accepts keys it does not know)
# names the attempt's own log, kept whole beside it. https://github.com/mlcommons/training_policies
RESUMED = "rn50perf_resumed"


class MLPerfLogger:
    """Writes `:::MLLOG` lines through mllog to `path`; a logger with `path=None` (ranks > 0) writes nothing.

    Each call passes mllog a stack offset that skips this wrapper, so `file` and `lineno` in the metadata name
    the code that called `event`/`start`/`end`, which the package checker's seed check relies on. Each line is
    stamped by `clock` (seconds since the epoch): the wall clock, or a simulated device's.
    """

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self._mllogger: mllog.MLLogger | None = None
        if path is not None:
            self._mllogger = mllog.MLLogger(logger=_file_logger(path), root_dir=str(REPO_ROOT))

    def event(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self._mllogger is not None:
            self._mllogger.event(key, value, metadata=metadata, time_ms=self._now_ms(), stack_offset=2)

    def start(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self._mllogger is not None:
            self._mllogger.start(key, value, metadata=metadata, time_ms=self._now_ms(), stack_offset=2)

    def end(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self._mllogger is not None:
            self._mllogger.end(key, value, metadata=metadata, time_ms=self._now_ms(), stack_offset=2)

    def resume(self, size: int, step: int, epoch: int) -> None:
        """Continue a stopped run's log: the attempt's whole log kept beside it, this one cut back to `size` bytes
        (its size at the checkpoint), then a line that says where the run resumed and names the attempt's log."""
        if self.path is not None:
            attempt = keep_attempt(self.path)
            truncate_to(self.path, size)
            self.event(RESUMED, {"step": step, "epoch": epoch, "stopped_attempt_log": attempt.name})

    def _now_ms(self) -> int:
        return round(self.clock() * 1000)

    def close(self) -> None:
        if self._mllogger is not None:
            for handler in self._mllogger.logger.handlers:
                handler.close()
            self._mllogger.logger.handlers.clear()


def _file_logger(path: Path) -> logging.Logger:
    """A private logging.Logger that appends each record to `path` as one flushed line."""
    logger = logging.getLogger(f"rn50perf.mllog.{path.resolve()}")
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.INFO)
    path.parent.mkdir(parents=True, exist_ok=True)
    logger.addHandler(logging.FileHandler(path, mode="a", encoding="utf-8"))
    return logger


def keep_attempt(path: Path) -> Path:
    """A copy of the log as a stopped attempt left it (`mlperf.attempt1.log`, then 2, ...: rundir.attempt_log),
    before a resumed run cuts it back to its checkpoint."""
    attempt = 1
    while (kept := rundir.attempt_log(path, attempt)).exists():
        attempt += 1
    kept.write_bytes(path.read_bytes())
    return kept


def truncate_to(path: Path, size: int) -> None:
    """Cut a log back to `size` bytes: a resumed run drops what was written after its checkpoint."""
    if path.exists() and path.stat().st_size > size:
        with path.open("r+b") as f:
            f.truncate(size)


__all__ = ["RESUMED", "MLPerfLogger", "constants", "keep_attempt", "truncate_to"]
