"""The stop signals, caught from a run's first line: SIGTERM, SIGINT and SIGUSR1.

SIGTERM is what SLURM sends at the time limit or on preemption, and what `kill`, container runtimes and torchrun
send; SIGUSR1 is the warning SLURM's `--signal=USR1@SECONDS` sends before the time limit, which it may send up to a
minute early (sbatch(1), --signal), so while a job is still importing; SIGINT is Ctrl-C.

train.py catches them before its heavy imports (torch alone takes seconds to import). Until the run's loop starts,
a stop signal ends the process at once: `StopRequested` is raised wherever the process stands, a SystemExit with
the signal's conventional status (128 + its number), so that it ends the process without a traceback even before
anything could catch it. While the loop runs (`running()`), the handler only notes the signal: the loop asks at
each step boundary (distributed.stop.agreed_stop), checkpoints and then raises it. A second SIGINT exits at once.

This package imports nothing but the standard library, so that a process can catch the signals first.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
STATUS_BASE = 128  # a process a signal ended exits with 128 + its number, as shells say (ending.py's table reads it)

_received = 0  # the first stop signal this process received, 0 for none
_owner = 0  # the process that installed the handlers: forked children inherit them
_at_once = True  # whether a stop signal raises StopRequested where the process stands (not while the loop runs)


class StopRequested(SystemExit):
    """A stop signal ended the run: before its loop, where the process stood; in it, at a step boundary, once
    checkpointed. A SystemExit, with the signal's status: it ends the process (and a sweep), no `except Exception`
    on its way up swallows it, and where nothing catches it Python exits with that status and no traceback."""

    def __init__(self, signum: int) -> None:
        super().__init__(STATUS_BASE + signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}"


def catch(at_once: bool = True) -> None:
    """From now on SIGTERM, SIGINT and SIGUSR1 stop the run instead of killing the process, for the rest of the
    process (a run is its last act). With `at_once`, a signal received while they were only noted is raised now;
    without it (a SLURM job's process before it calls its run: hydra_plugins/rn50perf_slurm.py), they are only
    noted until the next `catch()`."""
    global _owner, _at_once
    _owner = os.getpid()
    _at_once = at_once
    for signum in SIGNALS:
        signal.signal(signum, _note)
    if at_once and _received:
        raise StopRequested(_received)


def received() -> int:
    """The first stop signal this process received, 0 for none."""
    return _received


@contextmanager
def running() -> Iterator[None]:
    """While the run's loop runs: a stop signal is only noted, for the loop to stop at its next step boundary."""
    global _at_once
    _at_once = False
    try:
        yield
    finally:
        _at_once = True


def _note(signum: int, frame: Any) -> None:
    global _received
    if os.getpid() != _owner:  # a forked child (a data generator): as if there were no handler (Pool.terminate)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _received and signum == signal.SIGINT:
        os._exit(STATUS_BASE + signum)  # a second Ctrl-C: at once
    if _received:
        return
    _received = signum
    name = signal.Signals(signum).name
    if _at_once:
        os.write(2, f"\n{name} received: stopping now\n".encode())
        raise StopRequested(signum)
    os.write(2, f"\n{name} received: stopping at the next step boundary (Ctrl-C again to quit at once)\n".encode())
