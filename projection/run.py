"""What every hardware family's projection shares: the run around the steps. An MLPerf ResNet-50 run trains a
number of epochs and evaluates every few of them; each family's model times its own step and says how its runs
place the evaluations (the GPU systems between blocks of epochs, Graphcore's after training on saved checkpoints)."""

from __future__ import annotations

from dataclasses import dataclass

from data.datasets import IMAGENET_EVAL_IMAGES, IMAGENET_TRAIN_IMAGES


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
