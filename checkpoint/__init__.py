"""Checkpoints: written atomically (temporary file, then rename), loaded with weights_only, checked on load.

A training run's checkpoint holds its backend's state, where its loop stood, what each rank holds alone, and the
sizes its logs had, so that `restore_run` continues it bitwise (`save_run` writes it, `restore_point` finds it).
A write that fails (a full disk, a read-only directory) leaves the previous checkpoint as it was and raises
rundir.StorageError; `room_needed` is the free space a run directory needs for its checkpoints, and
`refuse_a_directory_too_small` refuses one without it before the run starts. A run uses them through its
`checkpointer.Checkpointer`, which owns when to save and what is left at the run's end.
"""

from __future__ import annotations

import io
import math
import os
import random
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import numpy as np
import torch

import distributed
import rundir
from backends.base import Backend
from configs.checks import ConfigError

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

FORMAT = 2  # 2: each rank's state (generators, the epoch's losses, BatchNorm statistics) under "ranks"


@dataclass
class Loop:
    """Where a run stands: the epoch under way, the optimizer steps taken, when run_start was logged, and how
    far the epoch has come: its steps taken and their losses on this rank."""

    epoch: int = 1
    step: int = 0
    run_start: float = 0.0
    epoch_step: int = 0  # the steps taken in the epoch under way
    losses: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def saved(cls, position: dict[str, Any], losses: list[torch.Tensor]) -> Loop:
        """The loop as a checkpoint holds it; those written before 2026-11-30 named epoch_step "batch"."""
        renamed = {("epoch_step" if key == "batch" else key): value for key, value in position.items()}
        return cls(**renamed, losses=losses)


def restore_point(out_dir: Path, log_file: str, resume: str, fingerprint: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint to continue from (`resume` is "auto" and one exists in `out_dir`), else None.

    A new run never writes into a directory that already holds an MLPerf log (`log_file`): two runs in one log
    would make it fail the checker. Nor into one holding any other file it would write (a user's config.yaml or
    model.pt in a hydra.run.dir given by hand): it never overwrites a file it did not write.
    """
    path = out_dir / rundir.CHECKPOINT
    if resume == "auto" and path.exists():
        return load(path, fingerprint)
    if (out_dir / log_file).exists():
        state = "a finished run" if (out_dir / rundir.FINAL_WEIGHTS).exists() else "a run with no checkpoint to resume"
        advice = "give a new hydra.run.dir"
        if path.exists():
            state = "a stopped run"
            advice = f"continue it with run.resume=auto (as {out_dir / rundir.RESUME_SCRIPT} does), or {advice}"
        raise ConfigError("run.resume", f"{out_dir} already holds {state}; {advice}")
    if refusal := rundir.refusal_to_overwrite(out_dir, lambda name: rundir.written_by_run(name, log_file), "a run"):
        raise ConfigError("hydra.run.dir", refusal)
    return None


def save_run(
    path: Path | None,
    backend: Backend,
    loop: Loop,
    log_sizes: Callable[[], dict[str, int]],
    fingerprint: dict[str, Any],
) -> None:
    """Called on every rank; rank 0 (the one with a `path`) writes the checkpoint, with what each rank holds alone:
    its generator states, its losses of the epoch so far and its backend's own state (BatchNorm statistics that the
    epoch's end has not averaged yet), and the `log_sizes` its logs have now."""
    own = {
        "rng": rng_state(),
        "losses": torch.stack(loop.losses).cpu() if loop.losses else torch.empty(0),
        "backend": backend.rank_state_dict(),
    }
    ranks = distributed.gather_to_main(own)
    if path is None:
        return
    position = {key: value for key, value in vars(loop).items() if key != "losses"}  # losses: per rank
    save(
        path,
        {
            "backend": backend.state_dict(),
            "loop": position,
            "ranks": ranks,
            "log_sizes": log_sizes(),
            "fingerprint": fingerprint,
        },
    )


def restore_run(state: dict[str, Any], backend: Backend, rank: int) -> tuple[Loop, dict[str, int]]:
    """Put `backend` and the generators back as the checkpoint `state` holds them for `rank`; returns where the
    loop stood and the sizes the run's logs had then."""
    own = state["ranks"][rank]
    try:
        backend.load_state_dict(state["backend"])
        backend.load_rank_state_dict(own["backend"])
    except (RuntimeError, KeyError, ValueError) as err:
        raise CheckpointError(f"checkpoint does not fit this model and optimizer: {err}") from err
    set_rng_state(own["rng"])
    loop = Loop.saved(state["loop"], list(own["losses"].to(backend.device).unbind()))
    return loop, state["log_sizes"]


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: unreadable, damaged, or from a run with different settings."""


def save(path: Path, state: dict[str, Any]) -> None:
    """Write a training checkpoint; a reader sees either the previous file or this one, never a partial one."""
    save_atomically(path, {"format": FORMAT, **state})


def save_atomically(path: Path, obj: Any) -> None:
    """Write `obj` with torch.save to a temporary file, then rename it to `path`. A write that fails removes the
    temporary file, leaves the file at `path` as it was, and raises rundir.StorageError with the size the file needed
    (an interrupted one removes the temporary file too).

    torch.save is given a file object, not the path: given a path, its C++ writer reports a full disk as
    "RuntimeError: unexpected pos" or "basic_ios::clear: iostream error", with no OSError to say why; given a file,
    the OSError is raised by the file's write, and arrives as the context of the RuntimeError that torch raises next
    (torch/serialization.py, _open_zipfile_writer_buffer.__exit__ ends the archive even when writing it failed).
    """
    tmp = rundir.temporary(path)
    try:
        with tmp.open("wb") as f:
            torch.save(obj, f)
        os.replace(tmp, path)
    except BaseException as err:
        with suppress(OSError):  # nothing was begun where it could not be opened (read-only, a folder gone)
            tmp.unlink()
        if (cause := _os_error(err)) is None:
            raise
        raise rundir.StorageError.of(path, cause, serialized_size(obj)) from err


def _os_error(err: BaseException | None) -> OSError | None:
    """The OSError that `err` is, or that it was raised from or while handling; None where there is none."""
    while err is not None and not isinstance(err, OSError):
        err = err.__cause__ or err.__context__
    return err


def serialized_size(obj: Any) -> int:
    """The bytes `save_atomically` writes for `obj`: torch.save into a sink that only counts them."""
    sink = _CountingSink()
    torch.save(obj, cast(IO[bytes], sink))  # a file object for torch.save, which calls only write and flush
    return sink.size


class _CountingSink(io.RawIOBase):
    """A writable file that keeps nothing and counts the bytes written to it. torch.save's zip writer calls a file
    object's write and then flush (torch/serialization.py, _open_zipfile_writer_buffer; its seek only under
    torch.serialization.skip_data, which a checkpoint does not use)."""

    def __init__(self) -> None:
        super().__init__()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:
        written = memoryview(data).nbytes
        self.size += written
        return written


def room_needed(state: Any, existing: Path, grows_by: int = 0) -> int:
    """The bytes a run directory must have free to save checkpoints of `state` (once it has grown by `grows_by`
    bytes) at `existing`, which may hold one already: a checkpoint's temporary copy is written beside the previous
    checkpoint, which stays until the rename, so at that moment the directory holds two checkpoints, of which the
    one already at `existing` is on disk."""
    size = serialized_size(state) + grows_by
    on_disk = existing.stat().st_size if existing.exists() else 0
    return max(2 * size - on_disk, 0)


def refuse_a_directory_too_small(out_dir: Path, backend: Backend, world_size: int) -> None:
    """A run directory without room for a checkpoint of `backend` (as `save_run` writes it, with the state its first
    step adds) and the copy written beside it is refused before the run starts: it would fail at its first or
    second checkpoint."""
    state = {"backend": backend.state_dict(), "ranks": [backend.rank_state_dict()] * world_size}
    needed = room_needed(state, out_dir / rundir.CHECKPOINT, grows_by=backend.state_to_come())
    if (free := rundir.free_bytes(out_dir)) < needed:
        raise ConfigError(
            "hydra.run.dir",
            f"{out_dir} has {free // rundir.MB} MB free on {rundir.filesystem(out_dir)}; the run needs "
            f"{math.ceil(needed / rundir.MB)} MB there, for a checkpoint and the copy written beside it: free space "
            "or give another hydra.run.dir",
        )


def load(path: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """Read a checkpoint written by `save` for a run whose training-relevant settings equal `fingerprint`."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as err:
        raise CheckpointError(f"no checkpoint at {path}") from err
    except Exception as err:  # torch raises RuntimeError, pickle and zip errors alike for damaged files
        raise _not_a_checkpoint(path) from err
    if not isinstance(state, dict) or "format" not in state:
        raise _not_a_checkpoint(path)
    if state["format"] != FORMAT:
        raise CheckpointError(
            f"{path} is in checkpoint format {state['format']}, this rn50perf reads format {FORMAT}: "
            "finish that run with the rn50perf version that started it"
        )
    if not isinstance(state.get("fingerprint"), dict):
        raise _not_a_checkpoint(path)
    differences = [
        f"{key}: checkpoint {state['fingerprint'].get(key)!r}, this run {value!r}"
        for key, value in fingerprint.items()
        if state["fingerprint"].get(key) != value
    ]
    if differences:
        raise CheckpointError(f"{path} was written with other settings: " + "; ".join(differences))
    return state


def _not_a_checkpoint(path: Path) -> CheckpointError:
    """The error for a file that torch cannot read back, or that this harness did not write: what to do about it,
    and none of torch's advice (loading with weights_only=False would run whatever the file holds)."""
    return CheckpointError(
        f"{path} is damaged or not a checkpoint of this harness: the run cannot continue; start it again with a new "
        "hydra.run.dir"
    )


def rng_state() -> dict[str, Any]:
    """Python's, NumPy's and torch's global generator states, in types that weights_only loading accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.array(keys)),  # a copy: the state is numpy's own array
            "pos": pos,
            "gauss": (has_gauss, gauss),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    numpy = state["numpy"]
    np.random.set_state((numpy["kind"], numpy["keys"].numpy(), numpy["pos"], *numpy["gauss"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
