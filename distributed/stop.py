"""Stopping a run cleanly: SIGTERM, SIGINT and SIGUSR1 end it at the next step boundary.

SIGTERM is what SLURM sends at the time limit or on preemption, and what `kill`, container runtimes and torchrun
send; SIGUSR1 is the warning SLURM's `--signal=USR1@SECONDS` sends before the time limit; SIGINT is Ctrl-C. The
handler only notes the signal: the training loop asks `StopRequested.agreed()` at each step boundary, which every rank
answers together (one all-reduce of a small integer), so one rank's signal stops all of them at the same step.
The loop then checkpoints, ends the MLPerf log and raises `StopRequested`; the process exits with the signal's
conventional status, 128 + its number. A second SIGINT exits at once: checkpoints are written to a temporary file
and renamed, so no moment of the run leaves a damaged one.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import rundir
from distributed.group import max_over_ranks
from distributed.topology import Topology
from monitor.progress import say

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

_received = 0  # the first stop signal this process received, 0 for none
_owner = 0  # the process that installed the handlers: forked children inherit them


class StopRequested(BaseException):
    """A stop signal ended the run at a step boundary. A BaseException, as KeyboardInterrupt is: it ends the
    process (and a sweep), and no `except Exception` on its way up may swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @classmethod
    def agreed(cls) -> StopRequested | None:
        """The stop, if any rank received a stop signal; the same answer on every rank, so every rank asks at the
        same point of the loop (the step boundary)."""
        signum = max_over_ranks(_received)
        return cls(signum) if signum else None

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def catch_stop_signals() -> None:
    """From now on, SIGTERM, SIGINT and SIGUSR1 request a stop instead of killing the process (for the rest of
    the process: a training run is its last act)."""
    global _owner
    _owner = os.getpid()
    for signum in SIGNALS:
        signal.signal(signum, _note)


def _note(signum: int, frame: Any) -> None:
    global _received
    if os.getpid() != _owner:  # a forked child (a data generator): as if there were no handler (Pool.terminate)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _received and signum == signal.SIGINT:
        os._exit(128 + signum)  # a second Ctrl-C: at once
    if not _received:
        _received = signum
        name = signal.Signals(signum).name
        os.write(2, f"\n{name} received: stopping at the next step boundary (Ctrl-C again to quit at once)\n".encode())


def resume_command(topology: Topology, overrides: Sequence[str], out_dir: Path) -> list[str]:
    """The command line that continues this run from its checkpoint: the same launcher and overrides, with
    run.resume=auto in the same run directory. Over several nodes torchrun also needs the launch's rendezvous
    options, which its workers are not told: the command is each node's, to run with them."""
    kept = [o for o in overrides if not o.lstrip("+~").startswith(("run.resume=", "hydra.run.dir="))]
    train = ["train.py", *kept, f"hydra.run.dir={out_dir}", "run.resume=auto"]
    if topology.launcher == "torchrun":
        local = int(os.environ.get("LOCAL_WORLD_SIZE", topology.world_size))
        nodes = topology.world_size // local
        where = ["--standalone"] if nodes == 1 else [f"--nnodes={nodes}"]
        return [sys.executable, "-m", "torch.distributed.run", *where, f"--nproc-per-node={local}", *train]
    if topology.launcher == "slurm":
        return ["srun", sys.executable, *train]
    return [sys.executable, *train]


def shell_line(command: Sequence[str], env: Mapping[str, str]) -> str:
    """`command` with `env` set, as one line to paste into a shell."""
    return shlex.join([*(f"{name}={value}" for name, value in env.items()), *command])


def write_resume_script(out_dir: Path, command: Sequence[str], env: Mapping[str, str], why: str) -> Path:
    """`resume.sh` in the run directory: `command` with `env`, run from the directory the run was started in."""
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
    script = out_dir / rundir.RESUME_SCRIPT
    script.write_text(f"#!/bin/sh\n# {why}\n{exports}cd {shlex.quote(os.getcwd())}\nexec {shlex.join(command)}\n")
    script.chmod(0o755)
    return script


def tell_how_to_resume(
    what: str,
    topology: Topology,
    overrides: Sequence[str],
    out_dir: Path,
    keep_env: Sequence[str],
) -> None:
    """Say `what` ended the run and the command that continues it from its checkpoint (with those of the
    `keep_env` variables that are set), on stderr and in the run directory's resume.sh."""
    env = {name: os.environ[name] for name in keep_env if name in os.environ}
    command = resume_command(topology, overrides, out_dir)
    script = write_resume_script(out_dir, command, env, f"{what}; this continues the run from its checkpoint")
    say(f"\n{what}", error=True)
    say(f"resume with:\n  {shell_line(command, env)}\n(also in {script})", error=True)
