"""The MLPerf log of a run: mllog lines in a file, written by rank 0 only, naming the real call sites."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from mlperf_logging.mllog import constants, mllog

import rundir

REPO_ROOT = Path(__file__).resolve().parent.parent
# A resumed run says so in its log. MLPerf's training rules (training_rules.adoc, "Run Results") time a run over
# one contiguous period and say "The clock may not be paused during the run": a resumed log keeps its run_start,
# so its time to train includes the time it was stopped, and this event (the checker accepts keys it does not know)
# names the attempt's own log, kept whole beside it. https://github.com/mlcommons/training_policies
RESUMED = "rn50perf_resumed"
# The training files an epoch skipped (data.corrupt=skip) that no earlier epoch of the attempt had: a reader of the
# log alone sees how many samples were not the dataset's own.
SKIPPED_FILES = "rn50perf_skipped_files"


class MLPerfLogger:
    """Writes `:::MLLOG` lines through mllog to `path`; a logger with `path=None` (ranks > 0) writes nothing.

    Each call passes mllog a stack offset that skips this wrapper, so `file` and `lineno` in the metadata name
    the code that called `event`/`start`/`end`, which the package checker's seed check relies on. Each line is
    stamped by `clock` (seconds since the epoch): the wall clock, or a simulated device's.

    A line that cannot be written (a full disk, a read-only directory) raises rundir.StorageError, the log cut back
    to whole lines (rundir.appending), so that it still parses; once there is room again, the next line is written.
    """

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self._mllogger: mllog.MLLogger | None = None
        if path is not None:
            with rundir.writing(path):
                self._mllogger = mllog.MLLogger(logger=_file_logger(path), root_dir=str(REPO_ROOT))

    def event(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        self._write("event", key, value, metadata)

    def start(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        self._write("start", key, value, metadata)

    def end(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        self._write("end", key, value, metadata)

    def _write(self, kind: str, key: str, value: Any, metadata: dict[str, Any] | None) -> None:
        """A line by mllog's `kind` method (event, start or end), whole or not at all; stack offset 3 skips this
        method and its caller."""
        if self._mllogger is None or self.path is None:
            return
        with rundir.appending(self.path):
            getattr(self._mllogger, kind)(key, value, metadata=metadata, time_ms=self._now_ms(), stack_offset=3)

    def resume(self, size: int, step: int, epoch: int) -> None:
        """Continue a stopped run's log: the attempt's whole log kept beside it, this one cut back to `size` bytes
        (its size at the checkpoint), then a line that says where the run resumed and names the attempt's log."""
        if self.path is not None:
            attempt = keep_attempt(self.path)
            with rundir.writing(self.path):
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
    logger.addHandler(_RaisingFileHandler(path, mode="a", encoding="utf-8"))
    return logger


class _RaisingFileHandler(logging.FileHandler):
    """A FileHandler whose failed write raises to the code that logged, instead of logging's printing a "--- Logging
    error ---" block and going on (logging.Handler.handleError, which StreamHandler.emit calls in its except block).

    The file that failed is closed without writing what its buffer still holds of the record: that rest would
    otherwise be written by the next flush, after the caller has cut the file back to whole lines. The next record
    opens the file again (FileHandler.emit opens a stream that is None)."""

    def handleError(self, record: logging.LogRecord) -> None:
        self._drop_stream()
        raise  # the exception StreamHandler.emit is handling

    def _drop_stream(self) -> None:
        """Close the file unflushed: closing its raw file first makes the buffered layer's close return at once
        (CPython Modules/_io/bufferedio.c, _io__Buffered_close_impl); the text layer's close asks the buffer whether
        it is closed. open() in text mode gives a TextIOWrapper over a BufferedWriter."""
        if self.stream is not None:
            cast(io.BufferedWriter, self.stream.buffer).raw.close()
            self.stream = None


def keep_attempt(path: Path) -> Path:
    """A copy of the log as a stopped attempt left it (`mlperf.attempt1.log`, then 2, ...: rundir.attempt_log),
    before a resumed run cuts it back to its checkpoint. A copy that cannot be written whole is removed, and
    rundir.StorageError raised."""
    attempt = 1
    while (kept := rundir.attempt_log(path, attempt)).exists():
        attempt += 1
    with rundir.writing(kept, needed=lambda: path.stat().st_size):
        try:
            kept.write_bytes(path.read_bytes())
        except OSError:
            kept.unlink(missing_ok=True)
            raise
    return kept


def truncate_to(path: Path, size: int) -> None:
    """Cut a log back to `size` bytes: a resumed run drops what was written after its checkpoint."""
    if path.exists() and path.stat().st_size > size:
        with path.open("r+b") as f:
            f.truncate(size)


__all__ = ["RESUMED", "SKIPPED_FILES", "MLPerfLogger", "constants", "keep_attempt", "truncate_to"]
