"""What a person reads after a run: a metrics CSV (one row per epoch) and a PNG of loss and accuracy."""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator


@dataclass
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


class MetricsCSV:
    """Appends one row per epoch; a resumed run first cuts the file back to its checkpoint's size.

    With `path=None` (ranks > 0) it writes nothing.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None and (not path.exists() or path.stat().st_size == 0):
            with path.open("w", newline="") as f:
                csv.writer(f).writerow(field.name for field in fields(EpochMetrics))

    def append(self, row: EpochMetrics) -> None:
        if self.path is None:
            return
        values = {k: ("" if v is None else v) for k, v in asdict(row).items()}
        with self.path.open("a", newline="") as f:
            csv.writer(f).writerow(values.values())

    def read(self) -> list[dict[str, str]]:
        with self.path.open(newline="") as f:
            return list(csv.DictReader(f))


def plot(rows: list[dict[str, str]], path: Path, target: float) -> None:
    """Training loss and evaluation top-1 against epoch, with the target accuracy drawn in."""
    epochs = [int(r["epoch"]) for r in rows]
    evals = [(int(r["epoch"]), float(r["eval_accuracy"])) for r in rows if r["eval_accuracy"]]
    fig, loss_ax = plt.subplots(figsize=(7, 4))
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
    fig.savefig(path, dpi=100)
    plt.close(fig)
