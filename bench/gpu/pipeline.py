"""Stages `loader` and `e2e`: the input pipeline at 224 px on ImageNet-like JPEGs, alone and feeding the step.

    loader  data.loading.loader as train.py builds it (data.build.make_loader), batch 256, timed for a few seconds
            from its first batch: the workers decoding (data.decode=cpu: the fused decode-and-crop, pinned batches
            on CUDA) with 4, 8 and every core but one of them ("8"); the workers reading the bytes and the GPU decoding
            (data.decode=gpu, "gpu/8") with the same counts; and the batch split (data.decode=hybrid,
            "hybrid0.8/15"), data.device_share of each batch decoded on the GPU and the rest by every worker
    e2e     the harness end to end: that loader feeding backend.train_step, with the fastest precision, speed
            options and worker count the earlier stages found (check.py passes them), for a fixed number of steps;
            and the time to train ImageNet on one GPU at that rate (projected_minutes)

The JPEGs are bench.photos' photo-like images in ImageNet's common sizes and a spread of its qualities, dealt over
8 classes in ImageNet's folder layout, generated once into the check's scratch folder for both stages. The
dataset holds 15 batches, so an epoch ends every 15 steps and the workers' restart at each epoch boundary is
timed too: a real epoch of ImageNet has 5,004 batches of 256, so these figures are if anything low.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from backends import build
from bench import photos
from bench.gpu import stage
from bench.gpu import step as step_stage
from bench.gpu.step import CLASSES
from bench.loader import endless, throughput
from configs.schema import Config, batch_shape
from data.build import make_loader, open_splits
from data.datasets import IMAGENET_EVAL_IMAGES, IMAGENET_TRAIN_IMAGES
from distributed import Topology
from projection import families

# ImageNet's most common sizes (width x height), with qualities spread over the 75 to 95 its files were saved at.
MIX = (((500, 375), 90), ((375, 500), 85), ((500, 333), 95), ((500, 500), 80), ((640, 480), 75))
PHOTO_CLASSES = 8
VAL_IMAGES = 16
LOADER_SECONDS = {False: 3.0, True: 1.0}  # per row: full, tiny
SHARES = (0.5, 0.8, 0.95)  # data.device_share of the hybrid rows: the share of each batch the GPU decodes


def imagenet_like(root: Path, images: int) -> Path:
    """`images` JPEGs in ROOT/train/<class>/ (and a few in ROOT/val/), made once."""
    if (root / "val").is_dir():
        return root
    for part, (size, quality) in enumerate(MIX):
        made = photos.generate(
            root.with_name(f"part{part}"),
            images=images // len(MIX),
            classes=PHOTO_CLASSES,
            size=size,
            quality=quality,
            seed=part,
        )
        for path in sorted((made.root / "train").rglob("*.JPEG")):
            target = root / "train" / path.parent.name / f"q{quality}_{path.name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            path.rename(target)
        shutil.rmtree(made.root)
    val = photos.generate(root.with_name("val-part"), images=VAL_IMAGES, classes=PHOTO_CLASSES, seed=len(MIX))
    (val.root / "train").rename(root / "val")
    shutil.rmtree(val.root)
    return root


def config(args: argparse.Namespace, sizes: stage.Sizes, *overrides: str) -> Config:
    root = imagenet_like(args.work / "photos", sizes.photos)
    return stage.composed(
        [
            "experiment=imagenet",
            f"data.root={root}",
            f"device={stage.device().type}",
            f"data.global_batch={sizes.batch}",
            f"data.image_size={sizes.image}",
            *overrides,
        ]
    )


def loader_keys(sizes: stage.Sizes) -> list[str]:
    """The loader stage's rows: each worker count decoding in the workers ("8") and on the device ("gpu/8"); then
    every worker with each hybrid share ("hybrid0.8/15")."""
    keys = [str(workers) for workers in sizes.workers] + [f"gpu/{workers}" for workers in sizes.workers]
    return keys + [f"hybrid{share}/{max(sizes.workers)}" for share in SHARES]


def loader_overrides(key: str) -> list[str]:
    """The overrides of a loader row: "8" (the workers decode), "gpu/8" (the device decodes) or "hybrid0.8/15"
    (the device decodes 0.8 of each batch, the workers the rest)."""
    decode, _, workers = key.rpartition("/")
    if decode.startswith("hybrid"):
        return [f"data.workers={workers}", "data.decode=hybrid", f"data.device_share={decode.removeprefix('hybrid')}"]
    return [f"data.workers={workers}", f"data.decode={decode or 'cpu'}"]


def loader_rate(args: argparse.Namespace, sizes: stage.Sizes, key: str) -> float:
    cfg = config(args, sizes, *loader_overrides(key))
    train, _ = open_splits(cfg.data, Topology())
    with make_loader(
        cfg.data, train, build.run_facts(cfg, Topology(), batch_shape(cfg, world_size=1)), seed=cfg.run.seed, train=True
    ) as batches:
        return round(throughput(batches, LOADER_SECONDS[args.tiny]), 1)


def loader(args: argparse.Namespace, sizes: stage.Sizes) -> stage.Figures:
    """The loader's rate in each row (loader_keys), its figures saved after each."""
    rates: stage.Figures = {}
    figures = {"batch": sizes.batch, "image": sizes.image, "images": sizes.photos, "img_s_by_workers": rates}
    for key in loader_keys(sizes):
        stage.attempt(key, lambda key=key: loader_rate(args, sizes, key), figures, args.json, rates)
    return figures


def rated(rate: object) -> bool:
    """Whether a loader row holds a rate (not why it has none)."""
    return isinstance(rate, int | float)


def fastest(work: Path) -> list[str]:
    """The overrides of the fastest harness step the `step` stage measured (step_stage.best), with the worker count the
    `loader` stage found fastest (their figures in WORK)."""
    overrides = step_stage.best(stage.recorded(work, "step").get("rows", {}))
    rows = stage.recorded(work, "loader").get("img_s_by_workers", {})
    rates = {key: rate for key, rate in rows.items() if rated(rate)}
    if rates:
        overrides += loader_overrides(max(rates, key=rates.get))
    return overrides


def e2e(args: argparse.Namespace, sizes: stage.Sizes) -> stage.Figures:
    overrides = fastest(args.work)
    cfg = config(args, sizes, *overrides)
    facts = build.run_facts(cfg, Topology(), batch_shape(cfg, world_size=1))
    train, _ = open_splits(cfg.data, Topology())
    batches = endless(make_loader(cfg.data, train, facts, seed=cfg.run.seed, train=True))
    backend = families.build_backend(cfg, facts, CLASSES)
    lr = cfg.optim.base_lr / 100

    def step() -> object:
        return backend.train_step(*next(batches), lr)

    seconds = stage.timed_steps(step, sizes.warmup, sizes.steps)
    rate = sizes.steps * sizes.batch / seconds
    best = stage.recorded(args.work, "step").get("rows", {}).get("best", {})
    eval_rate = best.get("eval_img_s") if isinstance(best, dict) else None
    figures: stage.Figures = {"img_s": round(rate, 1), "overrides": " ".join(overrides)}
    projected = projected_minutes(cfg, rate, eval_rate)
    return figures | {"projected_ttt_min": round(projected, 1), "eval_img_s": eval_rate or "assumed"}


EVAL_SPEEDUP = 3.0  # where the step stage measured no eval rate: a forward pass, a third of a training step


def projected_minutes(cfg: Config, img_s: float, eval_img_s: float | None = None) -> float:
    """Time to train ImageNet with the recipe `cfg` composes (experiment=imagenet: its epochs and evaluations) on
    one GPU at `img_s` training images a second, evaluating the 50,000 images at `eval_img_s` (the step stage's
    best row's eval rate; without it, EVAL_SPEEDUP times `img_s`)."""
    run, mlperf = cfg.run, cfg.mlperf
    evaluations = len(mlperf.eval_epochs(run.max_epochs))
    train_s = run.max_epochs * IMAGENET_TRAIN_IMAGES / img_s
    return (train_s + evaluations * IMAGENET_EVAL_IMAGES / (eval_img_s or EVAL_SPEEDUP * img_s)) / 60


if __name__ == "__main__":
    if sys.argv[1:2] == ["loader"]:
        sys.exit(stage.main(loader, argv=sys.argv[2:]))
    sys.exit(stage.main(e2e, argv=sys.argv[2:]))
