"""What a person watches: a tqdm bar with img/s, loss and lr on a terminal, plain lines elsewhere; each epoch's
line of figures and the run's summary."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NoReturn, Protocol

import torch
from tqdm import tqdm

import rundir
from monitor.metrics import EpochMetrics, warn

REFRESH_STEPS = 5  # reading the loss is a host sync, so the display refreshes every few steps
JOB_LOGGER = logging.getLogger("rn50perf.run")  # what `say` shows, kept in Hydra's job log (rundir.JOB_LOG)
JOB_LOGGER.propagate = False  # the terminal gets the line from print, bare
JOB_LOGGER.setLevel(logging.INFO)
JOB_LOGGER.addHandler(logging.NullHandler())  # no job log (hydra/job_logging=disabled): nothing, not stderr


def say(line: str, error: bool = False) -> None:
    """Show a line of the run's story on stdout (stderr for an error) and keep it in the job log."""
    print(line, file=sys.stderr if error else sys.stdout, flush=True)
    JOB_LOGGER.log(logging.ERROR if error else logging.INFO, line)


@contextmanager
def job_log() -> Iterator[None]:
    """For one Hydra job: what `say` shows goes to the job's log file(s) too, the root logger's file handlers,
    which Hydra's job logging opens in the run directory (rundir.JOB_LOG, train.log). A file that cannot be written
    is turned off (`_turn_off_on_failure`)."""
    files = [handler for handler in logging.getLogger().handlers if isinstance(handler, logging.FileHandler)]
    for handler in files:
        JOB_LOGGER.addHandler(handler)
        handler.handleError = partial(_turn_off_on_failure, handler)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for handler in files:
            JOB_LOGGER.removeHandler(handler)
            vars(handler).pop("handleError", None)  # the class's again


def _turn_off_on_failure(handler: logging.FileHandler, record: logging.LogRecord) -> None:
    """A job log's handleError: a line that cannot be written (a full disk, a read-only directory) removes the file's
    handler from every logger it is on, with one warning, instead of logging's printing a "--- Logging error ---"
    block for it and each line after it (logging.Handler.handleError, called in StreamHandler.emit's except block).
    The terminal still shows every line. Any other error (a record that does not format) is logging's to report."""
    error = sys.exception()
    if not isinstance(error, OSError):
        logging.FileHandler.handleError(handler, record)
        return
    for logger in (logging.getLogger(), *logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            logger.removeHandler(handler)
    warn(f"job log turned off: {rundir.StorageError.of(Path(handler.baseFilename), error)}")


class Progress:
    """One bar per epoch (mode "bar"), one line per epoch (mode "lines"), or nothing (mode "none")."""

    def __init__(self, mode: str, max_epochs: int, images_per_step: int) -> None:
        self.mode = ("bar" if sys.stderr.isatty() else "lines") if mode == "auto" else mode
        self.max_epochs = max_epochs
        self.images_per_step = images_per_step
        self._bar: tqdm[NoReturn] | None = None

    def start_epoch(self, epoch: int, steps: int, done: int = 0) -> None:
        """An epoch of `steps` steps, `done` of them already taken (a run resumed in its middle)."""
        if self.mode == "bar":
            self._bar = tqdm(
                total=steps * self.images_per_step,
                initial=done * self.images_per_step,
                desc=f"epoch {epoch}/{self.max_epochs}",
                unit="img",
                dynamic_ncols=True,
                leave=False,
            )

    def step(self, step_in_epoch: int, loss: torch.Tensor, lr: float) -> None:
        """Advance the bar; every REFRESH_STEPS steps read the loss (a host sync) and show it."""
        if self._bar is not None and step_in_epoch % REFRESH_STEPS == 0:
            self._bar.set_postfix(loss=f"{float(loss):.3f}", lr=f"{lr:.3g}", refresh=False)
            self._bar.update(step_in_epoch * self.images_per_step - self._bar.n)

    def end_epoch(self, line: str) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.mode != "none":
            say(line)


class SimulatedClock(Protocol):
    """A simulated system's clock (its backend's `simulated_clock`), as a run's lines show it beside the host's."""

    @property
    def system(self) -> str: ...

    @property
    def img_s(self) -> float: ...

    @property
    def elapsed_s(self) -> float: ...


@dataclass(frozen=True)
class Simulated:
    """A simulated system's `clock` as a run's lines show it beside the host's; `logged`: the MLPerf log, and so the
    rows' rates and the time to train, are on it (mlperf.clock=device)."""

    clock: SimulatedClock
    logged: bool


def epoch_line(max_epochs: int, row: EpochMetrics, simulated: Simulated | None = None) -> str:
    """The epoch's figures, with the share of its wall time spent waiting for data (and for the all-reduce). On a
    `simulated` system, its own throughput beside the host's."""
    line = f"epoch {row.epoch:3d}/{max_epochs}  loss {row.train_loss:.4f}  lr {row.lr:<9.4g}"
    line += f"{row.images_per_s:7.1f} img/s{rates(simulated)}  data wait {row.data_wait:4.0%}"
    line += f"  all-reduce {row.allreduce:4.0%}" if row.allreduce else ""
    return line + (f"  eval top-1 {row.eval_accuracy:.4f}" if row.eval_accuracy is not None else "")


def rates(simulated: Simulated | None) -> str:
    """What follows the epoch's img/s: on a simulated system, whose rate it is, and the other."""
    if simulated is None:
        return ""
    return " simulated" if simulated.logged else f" host  {simulated.clock.img_s:.1f} img/s simulated"


def print_summary(
    status: str,
    accuracy: float | None,
    epochs: int,
    minutes: float,
    out_dir: Path,
    skipped: dict[str, str],
    warned: set[str],
    simulated: Simulated | None = None,
) -> None:
    """The run's end: its status, `epochs` trained, last accuracy, time-to-train (on a `simulated` system, which
    clock's, and the system's own throughput and time to train), the files skipped and those decoded despite
    libjpeg's corrupt-data warnings, and where its outputs are."""
    shown = "n/a" if accuracy is None else f"{accuracy:.4f}"
    unreadable = f"\n{len(skipped)} unreadable files skipped (each reported above)" if skipped else ""
    if warned:
        unreadable += f"\n{len(warned)} files decoded despite libjpeg's corrupt-data warnings (as PIL decodes them)"
    say(
        f"\nrun_stop status {status}: {epochs} epochs, eval top-1 {shown}, "
        f"time to train {minutes:.2f} min{simulated_run(simulated)}{unreadable}\noutputs: {out_dir}"
    )


def simulated_run(simulated: Simulated | None) -> str:
    """After the run's time to train: which clock it is on, then the simulated system's own figures."""
    if simulated is None:
        return ""
    clock = simulated.clock
    seconds = clock.elapsed_s
    took = f"{seconds:.2f} s" if seconds < 60 else f"{seconds / 60:.2f} min"
    figures = f"simulated {clock.system}: {clock.img_s:,.0f} img/s, time to train {took}"
    if simulated.logged:
        return f" of simulated time (mlperf.clock=device)\n{figures}"
    return f" of host wall time\n{figures} (mlperf.clock=device logs it)"
