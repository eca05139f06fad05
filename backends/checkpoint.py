"""Checkpoints: written atomically (temporary file, then rename), loaded with weights_only, checked on load."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = 2  # 2: each rank's state (generators, the epoch's losses, BatchNorm statistics) under "ranks"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: unreadable, damaged, or from a run with different settings."""


def save(path: Path, state: dict[str, Any]) -> None:
    """Write a training checkpoint; a reader sees either the previous file or this one, never a partial one."""
    save_atomically(path, {"format": FORMAT, **state})


def save_atomically(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


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
        f"{path} is damaged or not a checkpoint of this harness: remove it, or give a new hydra.run.dir"
    )


def rng_state() -> dict[str, Any]:
    """Python's, NumPy's and torch's global generator states, in types that weights_only loading accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.copy()),
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
