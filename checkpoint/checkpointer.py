"""The checkpointer of one training run, after torchtitan's CheckpointManager and timm's CheckpointSaver: the run
asks it to restore, to save when a checkpoint is due, and to finish; it owns where the checkpoint lives, the
settings it must share with the run that resumes it, when one is due and the step the one on disk holds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import distributed
import rundir
from backends.base import Backend
from checkpoint import Loop, refuse_a_directory_too_small, restore_point, restore_run, save_atomically, save_run
from configs.schema import RunConfig
from distributed.stop import Resume, tell_how_to_resume


class Checkpointer:
    """Rank 0 writes the checkpoint into the run directory, with every rank's own state; each rank asks the same
    questions at the same step boundaries, since saving gathers from every rank."""

    def __init__(self, out_dir: Path, is_main: bool, fingerprint: dict[str, Any], resume: Resume, run: RunConfig):
        self.out_dir = out_dir
        self.path = out_dir / rundir.CHECKPOINT if is_main else None
        self.fingerprint = fingerprint  # the training settings a checkpoint must match (configs.schema)
        self.resume = resume  # the command that continues the run from its checkpoint
        self.resume_mode = run.resume  # auto: from the checkpoint in out_dir, where there is one
        self.every_steps = run.checkpoint_every_steps  # within an epoch too (0: at epoch ends only)
        self.at_epoch_ends = run.checkpoint
        self.saved_step: int | None = None  # the step of the checkpoint on disk, None before the first

    def restore_point(self, log_file: str) -> dict[str, Any] | None:
        """The checkpoint this run continues from, read by rank 0 and handed to every rank (checkpoint's
        restore_point: None for a new run, which a directory holding another run's files refuses)."""
        return distributed.from_main(lambda: restore_point(self.out_dir, log_file, self.resume_mode, self.fingerprint))

    def restore(self, state: dict[str, Any], backend: Backend, rank: int) -> tuple[Loop, dict[str, int]]:
        """`backend` and the generators put back as `state` holds them; where the loop stood and its logs' sizes."""
        loop, log_sizes = restore_run(state, backend, rank)
        self.saved_step = loop.step
        return loop, log_sizes

    def refuse_a_directory_too_small(self, backend: Backend, world_size: int) -> None:
        if self.path is not None:
            refuse_a_directory_too_small(self.out_dir, backend, world_size)

    def due_within_epoch(self, loop: Loop, steps_per_epoch: int) -> bool:
        """Every `every_steps` steps, but at an epoch's last step, whose checkpoint its end writes after evaluating:
        a lost rank then costs at most that many steps."""
        every = self.every_steps
        return every > 0 and loop.step % every == 0 and loop.epoch_step < steps_per_epoch

    def save(self, backend: Backend, loop: Loop, log_sizes: Callable[[], dict[str, int]]) -> None:
        """Called on every rank (it gathers their states); rank 0 writes."""
        save_run(self.path, backend, loop, log_sizes, self.fingerprint)
        self.saved_step = loop.step

    def finish(self, backend: Backend) -> None:
        """The run is over: rank 0 writes its final weights, then removes the checkpoint and resume.sh, as nothing
        is left to resume. A failed write (rundir.StorageError) leaves the checkpoint, which trains the last steps
        again to the same end."""
        if self.path is None:
            return
        save_atomically(self.out_dir / rundir.FINAL_WEIGHTS, backend.state_dict()["model"])
        for name in (rundir.CHECKPOINT, rundir.RESUME_SCRIPT):
            (self.out_dir / name).unlink(missing_ok=True)

    def tell_how_to_resume(self, what: str) -> None:
        """Say `what` ended the run, and write resume.sh, the command that continues it, into the run directory."""
        tell_how_to_resume(what, self.resume, self.out_dir)

    def after_a_failed_write(self) -> str:
        """What a run whose directory's filesystem failed a write leaves to resume, and how: resume.sh where the
        filesystem still takes it, else the command itself."""
        if self.saved_step is None:
            return "no checkpoint yet: free space and start the run again with a new hydra.run.dir"
        what = f"{rundir.CHECKPOINT} (step {self.saved_step}) is intact and resumes the run"
        try:
            script = self.resume.write_script(self.out_dir, what)
        except rundir.StorageError:
            return f"{what}: free space and run {self.resume.line()}"
        return f"{what}: free space and run {script}"
