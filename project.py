"""run.mode=project: the projected time to train on hardware the run does not execute on (no data, no MLPerf log),
printed after what it projects (the dataset, the recipe, the global batch) and kept in the run directory:
projection.txt (all of it) and projection.json (its figures, the last line).
A simulated IPU system (device=ipu_pod*, bow_pod*) gets its memory plan too; a GPU cluster (device=dgx_*,
pcie_l40s) its step from the model calibrated on NVIDIA's results, or from a step measured on one of its GPUs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

import rundir
from configs.checks import ConfigError
from configs.schema import Config
from configs.shape import BatchShape
from data.datasets import IMAGENET_TRAIN_IMAGES, dataset_size
from projection.families import answer, family_of


def project(cfg: Config, shape: BatchShape, out_dir: Path | None, command_line: Sequence[str], recipe: str) -> None:
    """Print the projection, after what it projects, and write it into `out_dir` too (rank 0's). `command_line`
    holds the run's overrides (whether they name run.max_epochs), `recipe` the experiment Hydra composed. An
    `out_dir` that already holds a projection's files is refused: they may be a user's."""
    if out_dir is not None and (
        refusal := rundir.refusal_to_overwrite(out_dir, PROJECTION_FILES.__contains__, "a projection")
    ):
        raise ConfigError("hydra.run.dir", refusal)
    torch.manual_seed(cfg.run.seed)
    text = answer(cfg, shape, command_line)
    said, figures = text.rsplit("\n", 1)
    said = "\n".join([*subject(cfg, recipe), said])
    if out_dir is not None:  # named before the figures, which stay the last line
        kept = f"{rundir.PROJECTION_TEXT}: all of this; {rundir.PROJECTION_JSON}: the last line"
        said += f"\noutputs: {out_dir} ({kept})"
    figures = json.dumps(json.loads(figures) | subject_figures(cfg, recipe))
    text = f"{said}\n{figures}"
    print(text, flush=True)
    if out_dir is not None:
        (out_dir / rundir.PROJECTION_TEXT).write_text(text + "\n")
        (out_dir / rundir.PROJECTION_JSON).write_text(figures + "\n")


EXPERIMENTS = Path(__file__).resolve().parent / "configs" / "experiment"
PROJECTION_FILES = frozenset({rundir.PROJECTION_TEXT, rundir.PROJECTION_JSON})


def subject(cfg: Config, recipe: str) -> list[str]:
    """What is projected, before the answer: the dataset and its training images, the recipe and the global batch;
    for the embedded synthetic set, that it is not ImageNet and what to add to project ImageNet."""
    _, images, _ = dataset_size(cfg.data)
    if cfg.data.name == "imagenet":
        return [
            f"projecting ImageNet ({images:,} training images), recipe experiment={recipe},"
            f" global batch {cfg.data.global_batch:,}"
        ]
    return [
        f"projecting the embedded synthetic set ({images:,} training images), recipe experiment={recipe},"
        f" global batch {cfg.data.global_batch:,}",
        f"not ImageNet: an epoch here is the embedded set's {images:,} images, not ImageNet's"
        f" {IMAGENET_TRAIN_IMAGES:,}; add {imagenet_recipe(cfg)} to project ImageNet",
    ]


def imagenet_recipe(cfg: Config) -> str:
    """The experiment that projects ImageNet on the run's device: the first of its own recipes there is (on a
    simulated IPU system, Graphcore's), else experiment=imagenet."""
    names = cfg.device.imagenet_experiments()
    found = [name for name in names if (EXPERIMENTS / f"{name}.yaml").is_file()]
    return f"experiment={found[0] if found else 'imagenet'}"


def subject_figures(cfg: Config, recipe: str) -> dict[str, object]:
    """subject() for the JSON line."""
    _, train_images, _ = dataset_size(cfg.data)
    return {
        "dataset": cfg.data.name,
        "train_images": train_images,
        "experiment": recipe,
        "global_batch": cfg.data.global_batch,
    }


def listed_cuts(cfg: Config, shape: BatchShape) -> bool:
    """Print what the device's family shows instead of running, where it does (a simulated IPU system's places to
    cut the model, for device.pipeline_splits=list), and say so: the run does nothing more."""
    preview = family_of(cfg).preview
    if preview is None:
        return False
    classes, _, _ = dataset_size(cfg.data)
    shown = preview(cfg, shape, classes)
    if shown is not None:
        print(shown, flush=True)
    return shown is not None
