"""The run's process group: opened from the launcher's environment, the few collectives the training loop
needs, and, when a rank dies or hangs, a message that names it.

torch.distributed tells a surviving rank only that a collective failed ("Connection closed by peer", a
timeout). To name the culprit every rank stamps the rendezvous store twice a second from a thread with its
step; a rank that exits writes why. On a failure the survivors read the stamps: a rank that wrote an exit
reason, stopped stamping (killed, frozen), or fell behind (hung in its own code) is named. Each process keeps
one group, as torch.distributed does, so the loop's functions need no handle passed around.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist

from distributed.topology import Topology

T = TypeVar("T")
BEAT_S = 0.5


class PeerLost(RuntimeError):
    """Another rank died, hung or was stopped; the run cannot go on."""

    # train.py's exit status for it, defined here for the SLURM launcher below ending.py, which exits with it as it
    # requeues the job (ending.py's table reads it); a batch script requeues on it too (examples/slurm)
    exit_status = 4


class _Heartbeat:
    """A thread that stamps `beat/<rank>` = "<step> <count>", so a stamp that stops changing is a rank that
    stopped running (compared on this rank's clock: hosts' clocks need not agree)."""

    def __init__(self, store: dist.Store, topology: Topology) -> None:
        self.store = dist.PrefixStore("rn50perf/", store.clone())  # its own connection, for the thread
        self.rank = topology.rank
        self.world_size = topology.world_size
        self.step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        count = 0
        while not self._stop.is_set():
            count += 1
            try:
                self.store.set(f"beat/{self.rank}", f"{self.step} {count}")
            except Exception:  # the store's host is gone; diagnose() reports it
                return
            self._stop.wait(BEAT_S)

    def close(self, reason: str) -> None:
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(Exception):  # the store is gone too: nobody is left to read the reason
            self.store.set(f"exit/{self.rank}", reason)

    def _read(self, key: str) -> str | None:
        return self.store.get(key).decode() if self.store.check([key]) else None

    def diagnose(self) -> str | None:
        """Which other rank failed, and how; None if every other rank looks alive and level with this one."""
        others = [r for r in range(self.world_size) if r != self.rank]
        try:
            before = {r: self._read(f"beat/{r}") for r in others}
            time.sleep(4 * BEAT_S)
            exits = {r: self._read(f"exit/{r}") for r in others}
            after = {r: self._read(f"beat/{r}") for r in others}
        except Exception as err:
            return f"the rendezvous store is unreachable ({err}): the rank or launcher that hosts it died"
        for r in others:
            if exits[r] is not None:
                return f"rank {r} exited ({exits[r]})"
        steps: dict[int, int] = {}
        for r in others:
            beat = after[r]
            if beat is None or beat == before[r]:
                step = "" if beat is None else f"; last seen at step {beat.split()[0]}"
                return f"rank {r} stopped responding (no heartbeat for {4 * BEAT_S:.0f} s{step})"
            steps[r] = int(beat.split()[0])
        steps[self.rank] = self.step
        behind, ahead = min(steps, key=steps.__getitem__), max(steps, key=steps.__getitem__)
        if steps[behind] < steps[ahead]:
            return f"rank {behind} is stuck at step {steps[behind]} (rank {ahead} reached step {steps[ahead]})"
        return None


_heartbeat: _Heartbeat | None = None
_control: dist.ProcessGroup | None = None  # gloo, for the loop's small host-side agreements when nccl carries data
_timeout: timedelta | None = None  # dist.timeout_s, for the groups made after the default one


def collective_timeout() -> timedelta | None:
    """How long a collective of this run's groups may wait (None outside `process_group`: torch's default). A
    group made later must be given it: torch gives a new group its own default (30 minutes), not the run's."""
    return _timeout


@contextmanager
def process_group(topology: Topology, device_type: str, timeout_s: float) -> Iterator[None]:
    """Open the process group for a run of several ranks (nothing for one), and close it on the way out.

    A collective that waits longer than `timeout_s` fails. A failure on any rank is raised as PeerLost naming
    the rank that caused it when one did; this rank's own errors pass through, and its exit reason is left
    in the store for the others.
    """
    if not topology.distributed:
        yield
        return
    global _heartbeat, _control, _timeout
    if device_type == "cuda":
        torch.cuda.set_device(topology.local_rank)
    store = dist.TCPStore(
        topology.master_addr,
        topology.master_port,
        topology.world_size,
        is_master=topology.is_main and not topology.agent_store,
        timeout=timedelta(seconds=timeout_s),
    )
    dist.init_process_group(
        "nccl" if device_type == "cuda" else "gloo",  # the CPU's, and the host's that simulated IPUs run on
        store=store,
        rank=topology.rank,
        world_size=topology.world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    _heartbeat = _Heartbeat(store, topology)
    _timeout = timedelta(seconds=timeout_s)
    if device_type == "cuda":
        control = dist.new_group(backend="gloo", timeout=_timeout)
        assert isinstance(control, dist.ProcessGroup)  # every rank is in it (never NON_GROUP_MEMBER)
        _control = control
    reason = "finished"
    try:
        yield
    except BaseException as err:
        reason = f"{type(err).__name__}: {err}".strip().splitlines()[0][:200]
        lost = as_lost_peer(err)
        if lost is None or lost is err:
            raise  # this rank's own error (a bad config, a bad file) or a clean stop: the others read its reason
        raise lost from err
    finally:
        _heartbeat.close(reason)
        _heartbeat = None
        _control = None
        _timeout = None
        dist.destroy_process_group()


def as_lost_peer(err: BaseException) -> PeerLost | None:
    """`err` as the loss of another rank (naming it where the heartbeats show which, which takes two seconds) if a
    collective failed or timed out because of one; None for this rank's own errors and for a clean stop."""
    if isinstance(err, PeerLost):
        return err
    if not isinstance(err, RuntimeError) or _heartbeat is None:
        return None
    rank = _heartbeat.rank
    cause = _heartbeat.diagnose()
    if cause is not None:
        return PeerLost(f"{cause}; rank {rank} stops too")
    if isinstance(err, dist.DistBackendError):
        return PeerLost(f"{err}; no other rank was seen failing; rank {rank} stops")
    return None


def record_step(step: int) -> None:
    """The step this rank has reached, for the heartbeat (a plain attribute write: free)."""
    if _heartbeat is not None:
        _heartbeat.step = step


def from_main(fn: Callable[[], T]) -> T:
    """`fn()` evaluated on rank 0 and sent to every rank; an exception it raises is raised on every rank.

    For decisions that must agree (the output directory, whether and from what to resume), and for what
    only rank 0 can see (its checkpoint, on a machine of its own).
    """
    if not dist.is_initialized():
        return fn()
    payload: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            payload = [_pack((True, fn()))]
        except Exception as err:
            payload = [_pack((False, err))]
    dist.broadcast_object_list(payload, src=0)
    ok, value = _unpack(payload[0])
    if not ok:
        raise value
    return cast(T, value)  # fn()'s result on rank 0


def agree_on_output_dir(own: Path) -> Path:
    """Rank 0's run directory, for every rank; another rank's own (empty) one is removed."""
    chosen = from_main(lambda: own)
    if own != chosen:
        with contextlib.suppress(OSError):
            own.rmdir()
    return chosen


def gather_to_main(obj: T) -> list[T]:
    """Every rank's `obj`, in rank order, on rank 0 (other ranks get an empty list)."""
    if not dist.is_initialized():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
    dist.gather_object(_pack(obj), gathered or None, dst=0)
    return [_unpack(packed) for packed in gathered]


def _pack(obj: Any) -> bytes:
    """torch.save's bytes: the object collectives' own pickling of tensors fails to load their storages."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _unpack(packed: bytes) -> Any:
    return torch.load(io.BytesIO(packed), weights_only=False)  # bytes from rank 0 of this very run


def broadcast_from_main(tensors: Iterable[torch.Tensor]) -> None:
    """Overwrite `tensors` in place with rank 0's values: replicas start from the same weights."""
    if dist.is_initialized():
        for tensor in tensors:
            dist.broadcast(tensor, src=0)


def average_over_ranks(tensors: list[torch.Tensor]) -> None:
    """Replace each tensor by its mean over the ranks, in place, with one all-reduce of them all."""
    if dist.is_initialized() and tensors:
        flat = torch.cat([t.flatten() for t in tensors])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for tensor, mean in zip(tensors, flat.split([t.numel() for t in tensors]), strict=True):
            tensor.copy_(mean.view_as(tensor))


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The elementwise sum of `tensor` over all ranks (in place; returned for chaining)."""
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor


def mean_over_ranks(value: float) -> float:
    if not dist.is_initialized():
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    return float(sum_over_ranks(torch.tensor([value], dtype=torch.float64, device=device))) / dist.get_world_size()


def max_over_ranks(value: int) -> int:
    """The largest of the ranks' `value`s, on every rank, through gloo (no device sync, even under nccl)."""
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=_control)
    return int(tensor)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
