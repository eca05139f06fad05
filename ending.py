"""How a run ends: its log's run_stop and what it leaves (the plot, the final weights or the checkpoint that resumes
it, the line that says how), and the exit status of train.py's process. `ENDINGS` below is the table of the ways a
run ends, each with its status, its line and whether its checkpoint resumes it; this table, README.md's and
docs/running.md's say what it says (tests/test_ending.py):

| exit status | the run | its checkpoint resumes it |
|---|---|---|
| 0 | reached the target | no |
| 1 | a bug (with its traceback) | no |
| 1 | a sweep none of whose runs reached the target | no |
| 2 | was refused | no |
| 3 | ended short of the target | no |
| 4 | lost a rank | yes |
| 5 | could not write its run directory | yes |
| 128 + N | stopped by signal N | yes |

A refusal is a mistake in the config, the data, a checkpoint, the launch or the run directory (`USER_ERRORS`), told
in one line. A run ends short of the target (`NotConverged`) with its epochs spent or its loss not finite; with
run.allow_not_converged=true it exits 0. A checkpoint resumes a run where it has one: a run stopped before its loop
has none and nothing to resume.

The rooms below this one raise their ending (distributed.PeerLost, rundir.StorageError, stopsignals.StopRequested)
and the table gives its status. Two of them need the number themselves, so it is defined there once and the table
reads it: the SLURM launcher exits with PeerLost's status as it requeues the job, and a stop signal ends the process
with 128 + its number (stopsignals.STATUS_BASE) before this module is even imported.

In a sweep, a job's error goes to its sweeper instead (train.py): Optuna's marks the trial failed and goes on, the
SLURM launcher requeues a job that lost a rank.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

import distributed
import rundir
import stopsignals
from checkpoint import CheckpointError
from configs.checks import ConfigError
from configs.errors import describe
from data.sources.split import DatasetError
from distributed import LaunchError, PeerLost
from mlperf_logs.logger import MLPerfLogger, constants
from monitor.metrics import plot
from monitor.progress import print_summary, say
from rundir import StorageError
from starting import Run
from stopsignals import StopRequested

USER_ERRORS = (ConfigError, DatasetError, CheckpointError, LaunchError, HydraException, OmegaConfBaseException)
NO_TRIAL_COMPLETED = "No trials are completed yet."  # optuna's study.best_trial, when every trial failed


class NotConverged(Exception):
    """The run ended (its epoch budget spent, or its loss not finite) short of the target accuracy."""

    def __init__(self, target: float) -> None:
        super().__init__(
            f"the run ended short of the target top-1 {target} (exit status {NOT_CONVERGED.status}; "
            "run.allow_not_converged=true exits 0)"
        )


@dataclass(frozen=True)
class Ending:
    """One way a run ends."""

    status: int  # train.py's exit status; a stop's is this plus the signal's number (`by_signal`)
    means: str  # what the run did, in the words of the table above, README.md and docs/running.md
    line: str  # what it prints to say so; `{err}` is the error's one line (configs.errors.describe)
    resumes: bool  # whether its checkpoint, where it has one, continues the run (resume.sh)
    raised_as: tuple[type[BaseException], ...] = ()  # the errors that end a run this way
    by_signal: bool = False


REACHED = Ending(0, "reached the target", "run_stop status success: ...", resumes=False)
BUG = Ending(1, "a bug (with its traceback)", "Traceback (most recent call last): ...", resumes=False)
NO_BEST_TRIAL = Ending(
    1,
    "a sweep none of whose runs reached the target",
    "error: no trial of the sweep reached the target, so there is no best one",
    resumes=False,
)
REFUSED = Ending(2, "was refused", "error: {err}", resumes=False, raised_as=USER_ERRORS)
NOT_CONVERGED = Ending(3, "ended short of the target", "not converged: {err}", resumes=False, raised_as=(NotConverged,))
LOST_RANK = Ending(PeerLost.exit_status, "lost a rank", "error: {err}", resumes=True, raised_as=(PeerLost,))
STORAGE_FAILED = Ending(
    5, "could not write its run directory", "error: {err}; {resume}", resumes=True, raised_as=(StorageError,)
)
STOPPED = Ending(
    stopsignals.STATUS_BASE,
    "stopped by signal N",
    "{err} at {where}: checkpoint written, log ended (run_stop aborted)",
    resumes=True,
    raised_as=(StopRequested,),
    by_signal=True,
)
ENDINGS = (REACHED, BUG, NO_BEST_TRIAL, REFUSED, NOT_CONVERGED, LOST_RANK, STORAGE_FAILED, STOPPED)
# what `leave` turns into an exit status: every ending's errors but a stop's, a SystemExit that ends the run itself
ERRORS = tuple(error for ending in ENDINGS if not ending.by_signal for error in ending.raised_as)

_raised_in_the_run: BaseException | None = None  # what the run of this job raised (`raised_in_the_run`)


def ending_of(err: BaseException) -> Ending:
    """The ending of a run that `err` ended: the first whose errors it is one of, else a bug."""
    return next((ending for ending in ENDINGS if isinstance(err, ending.raised_as)), BUG)


def leave(err: BaseException, output_dir: Path) -> NoReturn:
    """Exit as the table of endings says for a run that ended with `err` (one of ERRORS), saying what the lines
    before have not; a run refused before it started leaves no folder of its own in `output_dir`."""
    ending = ending_of(err)
    if ending is REFUSED:
        forget_refused_run(output_dir)
    if ending is STORAGE_FAILED:
        sys.exit(ending.status)  # rank 0 said which write failed and how the run goes on
    if ending is NOT_CONVERGED and not distributed.from_environment().is_main:
        sys.exit(ending.status)  # rank 0 says it, under its summary
    exit_saying(ending, err)


def exit_saying(ending: Ending, err: BaseException) -> NoReturn:
    """The ending's line, with `err` told in one line, and its exit status. For a mistake of the user's that line
    names it and says what to do (raised on, it would get a line of Hydra's own before it)."""
    print(ending.line.format(err=describe(err)), file=sys.stderr)
    sys.exit(ending.status)


@contextlib.contextmanager
def raised_in_the_run() -> Iterator[None]:
    """Around the run of a job (train.run): the error it raises is kept as the run's, so that an OSError raised
    around it, by Hydra's making of the run directory before the run, is told from one of the run's own
    (`hydras_failed_write`). Only this job's is kept: a sweep's earlier jobs' go, with what their tracebacks hold."""
    global _raised_in_the_run
    _raised_in_the_run = None
    try:
        yield
    except BaseException as err:
        _raised_in_the_run = err
        raise


def leave_before_the_run(err: BaseException) -> None:
    """Exit for an error raised around the run, not in it: a mistake in the overrides, a run directory Hydra could
    not make (REFUSED), a sweep with no best trial (NO_BEST_TRIAL). Any other error returns, to be raised on."""
    if isinstance(err, USER_ERRORS):
        exit_saying(REFUSED, err)
    if unwritable := hydras_failed_write(err):
        exit_saying(REFUSED, ConfigError("hydra.run.dir", str(StorageError.of(Path(unwritable.filename), unwritable))))
    if str(err) == NO_TRIAL_COMPLETED:
        exit_saying(NO_BEST_TRIAL, err)


def hydras_failed_write(err: BaseException) -> OSError | None:
    """The OSError of Hydra's making or writing of the run directory as a job starts (its folder, .hydra/, the
    train.log its logging opens: logging.config wraps that one in a ValueError), which comes before the run does;
    None for any other error, and for one the run raised (`raised_in_the_run`)."""
    failed = err if isinstance(err, OSError) else err.__cause__
    if not isinstance(failed, OSError) or not failed.filename or err is _raised_in_the_run:
        return None
    return failed


def forget_refused_run(directory: Path) -> None:
    """A run refused before it started leaves no folder: the one Hydra made for it holds only Hydra's record of the
    job and an empty train.log. Those files alone are removed, then the folders they leave empty; a folder holding
    anything more (an earlier run's, or a user's given as hydra.run.dir) stays as it is."""
    if not directory.is_dir():  # ranks but the first may have none
        return
    log = directory / rundir.JOB_LOG
    made_for_this_run = {path.name for path in directory.iterdir()} <= {rundir.HYDRA, rundir.JOB_LOG}
    if not made_for_this_run or (log.exists() and log.stat().st_size > 0):
        return
    for path in (*rundir.HYDRA_RECORD, rundir.JOB_LOG):
        (directory / path).unlink(missing_ok=True)
    for folder in (directory / rundir.HYDRA, directory):
        with contextlib.suppress(OSError):  # not empty: something else is there, and stays
            folder.rmdir()


@contextlib.contextmanager
def forgotten_unless_started(out_dir: Path, log_file: str, is_main: bool) -> Iterator[None]:
    """A run that ends before its clock starts (a stop signal, a refusal, a failure of its init phase) takes away
    the files it wrote in the run directory (its log's first lines, config.yaml, metrics.csv), so that the same
    command, or the requeued job, starts it again. A run directory it cannot write refuses the run (exit status 2)."""
    before = {path.name for path in out_dir.iterdir()} if is_main else set()
    try:
        yield
    except BaseException as err:
        if is_main:
            remove_written_since(out_dir, before, log_file)
        if isinstance(err, StopRequested) and is_main:
            say(f"{err} before the run started: nothing to resume; the same command starts it again", error=True)
        if isinstance(err, StorageError):
            raise ConfigError("hydra.run.dir", str(err)) from err
        raise


def remove_written_since(out_dir: Path, before: set[str], log_file: str) -> None:
    """The files a run writes that `out_dir` did not hold (`before`): what was there stays (a stopped run's
    checkpoint and logs, the user's files), and so do Hydra's record of the job and train.log, which say what
    happened."""
    for path in out_dir.iterdir():
        new = path.name not in before and path.name not in (rundir.HYDRA, rundir.JOB_LOG)
        if new and path.is_file() and rundir.written_by_run(path.name, log_file):
            path.unlink()


def end_log_aborted(log: MLPerfLogger) -> bool:
    """run_stop aborted, and the log closed; False where its filesystem could not take the line (the log then
    ends with its last whole line)."""
    try:
        log.end(constants.RUN_STOP, metadata={constants.STATUS: constants.ABORTED})
    except StorageError:
        return False
    finally:
        log.close()
    return True


def end_stopped(run: Run, err: BaseException) -> None:
    """The log of a run that did not end on its own ends aborted, where it can still be written; a stopped one, or
    one that lost a rank or a write of its directory after its first checkpoint, says how to resume it."""
    log_ended = end_log_aborted(run.log)
    main, saved = run.topology.is_main, run.checkpoints.saved_step
    if main and not isinstance(err, StorageError):  # nothing more on a filesystem that failed
        plot_so_far(run)  # a stopped or failed run's epochs so far
    if isinstance(err, StopRequested):
        if main:
            run.checkpoints.tell_how_to_resume(STOPPED.line.format(err=err, where=run.where()))
        distributed.barrier()  # rank 0's checkpoint and log are whole before any rank exits
    elif isinstance(err, StorageError) and main:
        say_storage_failed(run, err, "" if log_ended else "; the log could not take its run_stop")
    elif isinstance(err, PeerLost) and main:
        lost = f"a rank was lost at {run.where()}: log ended (run_stop aborted)"
        if saved is None:
            say(f"\n{lost}; no checkpoint yet, so start the run again with a new hydra.run.dir", error=True)
        else:
            again = run.loop.step - saved
            run.checkpoints.tell_how_to_resume(
                f"{lost}; its checkpoint is at step {saved} ({again} steps to take again)"
            )


def say_storage_failed(run: Run, err: StorageError, unended: str = "") -> None:
    say(STORAGE_FAILED.line.format(err=f"{err}{unended}", resume=run.checkpoints.after_a_failed_write()), error=True)


def finish(run: Run, status: str, accuracy: float | None) -> tuple[str, float]:
    """run_stop, the plot and the final weights; nothing is left to resume. Returns the status and minutes."""
    try:
        run.log.end(constants.RUN_STOP, metadata={constants.STATUS: status})
        minutes = (run.log.clock() - run.loop.run_start) / 60
        run.log.close()
        if run.topology.is_main:
            plot_so_far(run)
        run.checkpoints.finish(run.backend)
    except StorageError as err:  # the last checkpoint trains the last steps again, to the same end
        if run.topology.is_main:
            say_storage_failed(run, err)
        raise
    if run.topology.is_main:
        skipped = {**run.train_loader.skipped, **run.val_loader.skipped}
        warned = run.train_loader.warned | run.val_loader.warned
        print_summary(status, accuracy, run.loop.epoch - 1, minutes, run.out_dir, skipped, warned, run.simulated)
    return status, minutes


def plot_so_far(run: Run) -> None:
    """metrics.png from the epochs ended so far, on rank 0 (which writes metrics.csv); none before the first."""
    if run.metrics.path is not None and (rows := run.metrics.read()):
        plot(rows, run.out_dir / rundir.PLOT, run.cfg.mlperf.target_accuracy)
