"""What every hardware family's projection shares: the run around the steps. An MLPerf ResNet-50 run trains a
number of epochs and evaluates every few of them; each family's model times its own step and says how its runs
place the evaluations (the GPU systems between blocks of epochs, Graphcore's after training on saved checkpoints)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from configs.checks import ConfigError
from data.datasets import IMAGENET_EVAL_IMAGES, IMAGENET_TRAIN_IMAGES
from mlperf_logs import rcp


@dataclass(frozen=True)
class Schedule:
    """What a run does besides its steps: `epochs` of `train_images`, an evaluation (or a checkpoint evaluated later)
    every `eval_every` epochs from `first_eval` and at the last, each on `eval_images`."""

    epochs: int
    train_images: int = IMAGENET_TRAIN_IMAGES
    eval_images: int = IMAGENET_EVAL_IMAGES
    eval_every: int = 4
    first_eval: int = 4

    def eval_epochs(self) -> list[int]:
        """The epochs an evaluation follows, as mlperf.eval_epochs gives them for a run."""
        return sorted(set(range(self.first_eval, self.epochs + 1, self.eval_every)) | {self.epochs})


@dataclass(frozen=True)
class Epochs:
    """The epochs a projection trains, and where they come from, as its report says."""

    count: int
    source: str


def given_epochs(epochs: int) -> Epochs:
    return Epochs(epochs, f"{epochs} epochs (run.max_epochs)")


def first_evaluation_from(epoch: int, first_eval: int, eval_every: int) -> int:
    """The first evaluation at or after `epoch`: a run stops at the evaluation that reaches the target."""
    if epoch <= first_eval:
        return first_eval
    return first_eval + math.ceil((epoch - first_eval) / eval_every) * eval_every


def reference_epochs(global_batch: int, first_eval: int, eval_every: int) -> Epochs:
    """MLPerf's reference convergence point for the global batch (mlperf-logging's RCPs for ResNet, interpolated as
    its RCP checker does), rounded, then on to the evaluation that would see it."""
    reference = rcp.reference_for(global_batch)
    if reference.record is None:
        largest = rcp.rcp_batch_sizes()[-1]
        raise ConfigError(
            "run.max_epochs",
            f"global batch {global_batch:,} is above MLPerf's largest reference convergence point ({largest:,}):"
            " give the epochs to train",
        )
    mean = float(reference.record["RCP Mean"])
    epochs = first_evaluation_from(round(mean), first_eval, eval_every)
    how = ""
    if reference.between is not None:
        how = " interpolated between {:,} and {:,}".format(*reference.between)
    elif reference.case == rcp.BELOW_SMALLEST:
        how = f" (the smallest RCP's, batch {reference.record['BS']:,})"
    return Epochs(
        epochs,
        f"{epochs} epochs: MLPerf's reference convergence point for global batch {global_batch:,} is {mean:.1f}"
        f" epochs{how} (mlperf-logging's RCPs), evaluated at epoch {epochs}; run.max_epochs=N sets them",
    )
