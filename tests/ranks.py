"""Run a function in N processes joined by a gloo process group, and collect what each rank returns."""

from __future__ import annotations

import gc
import pickle
import socket
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.forked import fork_server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120) -> list[Any]:
    """`fn(rank, world_size, *args)` on each rank (a module-level function, so it can be pickled). Each rank is
    forked from multiprocessing's fork server, which imported torch and the tests' helpers once (tests/forked.py): not
    from this process, since a fork after it ran backward on autograd's threads (a compiled model's) cannot run
    backward, and not spawned, which imports torch again for every rank (seconds each).

    Returns the ranks' results in rank order (pickled through files); a rank's exception is raised here
    with its traceback.
    """
    with tempfile.TemporaryDirectory() as tmp:
        arguments = (world_size, free_port(), tmp, fn, args, timeout_s)
        fork_server()  # what it imports, should this be its first fork
        mp.start_processes(_rank_main, arguments, nprocs=world_size, start_method="forkserver")
        results = []
        for rank in range(world_size):
            with open(f"{tmp}/{rank}.pkl", "rb") as f:
                ok, value = pickle.load(f)
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results.append(value)
    return results


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    out_dir: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    timeout_s: float,
) -> None:
    gc.freeze()  # what this rank imported lives until it exits: its exit need not walk it (a second per rank)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        outcome = (True, fn(rank, world_size, *args))
    except Exception:
        outcome = (False, traceback.format_exc())
    finally:
        dist.destroy_process_group()
    with open(f"{out_dir}/{rank}.pkl", "wb") as f:
        pickle.dump(outcome, f)
