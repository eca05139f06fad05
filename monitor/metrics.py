"""What a person reads during and after a run: a metrics CSV and TensorBoard scalars (one row, one point per
epoch), and a PNG of loss and accuracy.

metrics.csv is what a resumed run cuts back to, so a row that cannot be written ends the run (rundir.StorageError);
TensorBoard and the plot are side outputs: one that cannot be written is turned off with one warning, and the run
goes on.
"""

from __future__ import annotations

import csv
import itertools
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event, SessionLog  # type: ignore[import-untyped]
from tensorboard.compat.proto.summary_pb2 import Summary  # type: ignore[import-untyped]
from tensorboard.summary.writer.record_writer import RecordWriter  # type: ignore[import-untyped]

import rundir
from mlperf_logs.logger import truncate_to


@dataclass(kw_only=True)  # by keyword: two floats side by side (lr, loss) are easy to swap
class EpochMetrics:
    epoch: int
    step: int
    lr: float
    train_loss: float
    images_per_s: float
    eval_accuracy: float | None
    elapsed_s: float
    loss_scale: float = 1.0  # at the epoch's end (1 without loss scaling)
    skipped_steps: int = 0  # updates skipped so far because the loss or gradients were not finite
    # Where the epoch's wall time went (fractions of it, evaluation included): see EpochTimer
    data_wait: float = 0.0
    step_time: float = 0.0
    allreduce: float = 0.0
    evaluation: float = 0.0


class EpochTimer:
    """Where each epoch's wall time went: waiting for data, in the all-reduce that backward did not hide (both read
    from counters that only grow, at the epoch's start and end), in evaluation (timed here), and the rest: the
    step (forward, backward, update). So a run shows its bottleneck."""

    def __init__(self, waited_for_data: Callable[[], float], waited_for_allreduce: Callable[[], float]) -> None:
        self._counters = (waited_for_data, waited_for_allreduce)

    def start(self) -> None:
        self._started = time.perf_counter()
        self._at_start = [counter() for counter in self._counters]
        self._eval_s = 0.0

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self._eval_s += time.perf_counter() - started

    def fractions(self) -> dict[str, float]:
        """EpochMetrics' time fields for the epoch since `start()`, each a fraction of its wall time."""
        total = max(time.perf_counter() - self._started, 1e-9)
        data_s, allreduce_s = (c() - s for c, s in zip(self._counters, self._at_start, strict=True))
        step_s = max(total - data_s - allreduce_s - self._eval_s, 0.0)
        return {
            "data_wait": data_s / total,
            "step_time": step_s / total,
            "allreduce": allreduce_s / total,
            "evaluation": self._eval_s / total,
        }


class MetricsCSV:
    """Appends one row per epoch to the CSV, and the same figures as TensorBoard scalars (stepped by the
    optimizer step) when given a folder for them. A resumed run cuts both back to its checkpoint.

    A row that cannot be written raises rundir.StorageError, the CSV left with whole rows; TensorBoard that cannot
    be written is turned off for the rest of the run, with one warning. With `path=None` (ranks > 0) it writes
    nothing.
    """

    def __init__(self, path: Path | None, tensorboard: Path | None = None) -> None:
        self.path = path
        self.tensorboard = tensorboard if path is not None else None
        self._events: EventFile | None = None
        self._purge_step: int | None = None
        if path is not None and (not path.exists() or path.stat().st_size == 0):
            with rundir.appending(path), path.open("w", newline="") as f:
                csv.writer(f).writerow(field.name for field in fields(EpochMetrics))

    def resume(self, size: int, step: int) -> None:
        """Continue from a checkpoint taken at `step`, when the CSV was `size` bytes long: later rows are cut,
        and TensorBoard drops the points a stopped run wrote after that step."""
        if self.path is not None:
            truncate_to(self.path, size)
            self._purge_step = step + 1

    def append(self, row: EpochMetrics) -> None:
        if self.path is None:
            return
        values = {k: ("" if v is None else v) for k, v in asdict(row).items()}
        with rundir.appending(self.path), self.path.open("a", newline="") as f:
            csv.writer(f).writerow(values.values())
        self._add_scalars(row)

    def _add_scalars(self, row: EpochMetrics) -> None:
        if self.tensorboard is None:
            return
        scalars = {
            "train/loss": row.train_loss,
            "train/lr": row.lr,
            "train/images_per_s": row.images_per_s,
            "eval/top1": row.eval_accuracy,
            **{f"time/{name}": getattr(row, name) for name in ("data_wait", "step_time", "allreduce", "evaluation")},
        }
        try:
            if self._events is None:
                self._events = EventFile(self.tensorboard, self._purge_step)
            self._events.add_scalars({tag: value for tag, value in scalars.items() if value is not None}, row.step)
        except rundir.StorageError as err:
            self.tensorboard = self._events = None
            warn(f"TensorBoard turned off: {err}")

    def read(self) -> list[dict[str, str]]:
        if self.path is None:
            return []
        with self.path.open(newline="") as f:
            return list(csv.DictReader(f))


_EVENT_FILES = itertools.count()  # numbers a process's event files apart, as tensorboard's own _global_uid does


class EventFile:
    """A TensorBoard event file in `folder`, to which each call appends its points in the caller's thread, whole or
    not at all (rundir.appending raises StorageError, the file cut back to whole records).

    Written here rather than by torch's SummaryWriter, which writes from a thread of its own: a failed write there is
    printed by threading as a traceback before the next flush raises it again (tensorboard's
    summary/writer/event_file_writer.py, _AsyncWriterThread.run). The file is named and begun as SummaryWriter does:
    TensorBoard reads a folder's files in name order, and a SessionLog START at `purge_step` (a resumed run's first
    step) drops the points a stopped run wrote from that step on (SummaryWriter's purge_step).
    """

    def __init__(self, folder: Path, purge_step: int | None = None) -> None:
        with rundir.writing(folder):
            folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        name = f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.{next(_EVENT_FILES)}"
        self.path = folder / name
        begun = [Event(wall_time=now, file_version="brain.Event:2")]
        if purge_step is not None:
            begun.append(Event(wall_time=now, step=purge_step, session_log=SessionLog(status=SessionLog.START)))
        self._append(begun)

    def add_scalars(self, scalars: dict[str, float], step: int) -> None:
        now = time.time()
        points = [Summary(value=[Summary.Value(tag=tag, simple_value=value)]) for tag, value in scalars.items()]
        self._append([Event(wall_time=now, step=step, summary=point) for point in points])

    def _append(self, events: list[Event]) -> None:
        with rundir.appending(self.path), self.path.open("ab") as f:
            records = RecordWriter(f)
            for event in events:
                records.write(event.SerializeToString())


def warn(line: str) -> None:
    """A side output turned off: one line on stderr, and the run goes on."""
    print(f"warning: {line}", file=sys.stderr, flush=True)


def plot(rows: list[dict[str, str]], path: Path, target: float) -> bool:
    """Training loss and evaluation top-1 against epoch, with the target accuracy drawn in; whether it was written.
    A plot that cannot be written (a full disk, a read-only directory) is removed rather than left empty or cut
    short, and said in one warning line."""
    epochs = [int(r["epoch"]) for r in rows]
    evals = [(int(r["epoch"]), float(r["eval_accuracy"])) for r in rows if r["eval_accuracy"]]
    from matplotlib.figure import Figure  # imported here: half a second off every start of train.py
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7, 4))
    loss_ax = fig.subplots()
    loss_ax.plot(epochs, [float(r["train_loss"]) for r in rows], "o-", color="tab:blue", label="train loss")
    loss_ax.set_xlabel("epoch")
    loss_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    loss_ax.set_ylabel("train loss", color="tab:blue")
    acc_ax = loss_ax.twinx()
    if evals:
        acc_ax.plot(*zip(*evals, strict=True), "s-", color="tab:orange", label="eval top-1")
    acc_ax.axhline(target, color="tab:orange", linestyle=":", label=f"target {target}")
    acc_ax.set_ylim(0, 1)
    acc_ax.set_ylabel("eval top-1", color="tab:orange")
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.legend(loc="upper center", ncol=3, fontsize="small")
    try:
        with rundir.writing(path):
            fig.savefig(path, dpi=100)
    except rundir.StorageError as err:
        with suppress(OSError):  # nothing was begun where it could not be opened (read-only, a folder gone)
            path.unlink()
        warn(f"plot not written: {err}")
        return False
    return True
