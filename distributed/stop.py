"""Stopping a run cleanly at a step boundary, on every rank together, and saying how to resume it.

stopsignals notes SIGTERM, SIGINT and SIGUSR1 while the loop runs; the loop asks `agreed_stop()` at each step
boundary, which every rank answers together (one all-reduce of a small integer), so one rank's signal stops all of
them at the same step. The loop then checkpoints, ends the MLPerf log and raises the `StopRequested`; the process
exits with the signal's conventional status, 128 + its number. A second SIGINT exits at once: checkpoints are
written to a temporary file and renamed, so no moment of the run leaves a damaged one.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import rundir
import stopsignals
from distributed.group import max_over_ranks
from distributed.topology import Topology
from monitor.progress import say
from stopsignals import StopRequested


def agreed_stop() -> StopRequested | None:
    """The stop, if any rank received a stop signal; the same answer on every rank, so every rank asks at the same
    point of the loop (the step boundary)."""
    signum = max_over_ranks(stopsignals.received())
    return StopRequested(signum) if signum else None


class Resume(NamedTuple):
    """The command that continues a run from its checkpoint, with the environment variables it needs."""

    argv: list[str]
    env: dict[str, str]

    @classmethod
    def of(cls, topology: Topology, overrides: Sequence[str], out_dir: Path, keep_env: Sequence[str]) -> Resume:
        """The same launcher and overrides, with run.resume=auto in the same run directory, and those of the
        `keep_env` variables that are set. Over several nodes torchrun also needs the launch's rendezvous options,
        which its workers are not told: the command is each node's, to run with them."""
        kept = [o for o in overrides if not o.lstrip("+~").startswith(("run.resume=", "hydra.run.dir="))]
        train = ["train.py", *kept, f"hydra.run.dir={out_dir}", "run.resume=auto"]
        env = {name: os.environ[name] for name in keep_env if name in os.environ}
        if topology.launcher == "torchrun":
            local = int(os.environ.get("LOCAL_WORLD_SIZE", topology.world_size))
            nodes = topology.world_size // local
            where = ["--standalone"] if nodes == 1 else [f"--nnodes={nodes}"]
            return cls(
                [sys.executable, "-m", "torch.distributed.run", *where, f"--nproc-per-node={local}", *train], env
            )
        if topology.launcher == "slurm":
            return cls(["srun", sys.executable, *train], env)
        return cls([sys.executable, *train], env)

    def line(self) -> str:
        """The command as one line to paste into a shell."""
        return shlex.join([*(f"{name}={value}" for name, value in self.env.items()), *self.argv])

    def write_script(self, out_dir: Path, why: str) -> Path:
        """`resume.sh` in the run directory, run from the directory the run was started in: written beside it and
        renamed into place, so that a write its filesystem refuses (rundir.StorageError) leaves the one before."""
        exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in self.env.items())
        text = f"#!/bin/sh\n# {why}\n{exports}cd {shlex.quote(os.getcwd())}\nexec {shlex.join(self.argv)}\n"
        script = out_dir / rundir.RESUME_SCRIPT
        written = rundir.temporary(script)
        try:
            with rundir.writing(script):
                written.write_text(text)
                written.chmod(0o755)
                os.replace(written, script)
        finally:
            written.unlink(missing_ok=True)
        return script


def tell_how_to_resume(what: str, resume: Resume, out_dir: Path) -> None:
    """Say `what` ended the run and the command that continues it from its checkpoint, on stderr and in the run
    directory's resume.sh."""
    script = resume.write_script(out_dir, f"{what}; this continues the run from its checkpoint")
    say(f"\n{what}", error=True)
    say(f"resume with:\n  {resume.line()}\n(also in {script})", error=True)
