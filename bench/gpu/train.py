"""Stage `train`: train.py itself, as a user starts it (`device=cuda`, nothing else about speed), on the photo-like
JPEGs at 224 px: the headline figure, read from what train.py writes (metrics.csv's epoch rates, mlperf.log).

Runs, each a fresh train.py process in its own output folder:

  defaults      device=cuda: the config's speed defaults (configs/device/cuda.yaml; experiment=imagenet's loader
                workers, every core but one; data.decode=auto, which times both decoders at start-up and picks:
                the one line train.py prints about it, starting "data.decode=auto", is kept as "decode_auto")
  decode=cpu    the same with data.decode=cpu: the workers decode, as before data.decode=auto

The dataset is the loader stage's photo-like set (bench.gpu.pipeline.imagenet_like) hard-linked REPEAT times under
other names, so an epoch has 60 steps of 256 (ImageNet's has 5,004: its epoch boundaries, where the workers start
the next epoch's batches, weigh less still). Only the batch and the image size are set for the measurement, and
the run's length: `run.max_epochs`, an evaluation at its end on a validation set one batch long (so evaluation
compiles no second shape), mlperf.target_accuracy=1.0 so that no run stops early, and no checkpoints (a 100 MB
file each epoch of three seconds; a real epoch is minutes). The rate is the median of the epochs after the first
(whose batches wait for the workers to start and fill their queues) from metrics.csv, the rate train.py logs and
shows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import rundir
from bench.gpu import stage
from bench.gpu import step as step_stage
from bench.gpu.pipeline import imagenet_like
from data.sources.synthetic import CACHE_ENV
from mlperf_logs.summarize import summarize_run
from monitor.metrics import MetricsCSV

REPEAT = {False: 4, True: 1}  # copies of the photo set (full, tiny)
EPOCHS = {False: 5, True: 3}
VARIANTS = {"defaults": [], "decode=cpu": ["data.decode=cpu"]}
AUTO = "data.decode=auto"  # how the line starts that says what data.decode=auto chose


def training_set(work: Path, sizes: stage.Sizes, repeat: int) -> Path:
    """The loader stage's photos, each hard-linked `repeat` times into train/, the validation set as it is."""
    photos = imagenet_like(work / "photos", sizes.photos)
    root = work / f"train-photos-x{repeat}"
    if (root / "val").is_dir():
        return root
    for path in sorted((photos / "train").rglob("*.JPEG")):
        for copy in range(repeat):
            target = root / "train" / path.parent.name / f"r{copy}_{path.name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, target)
    shutil.copytree(photos / "val", root / "val")
    return root


def overrides(root: Path, sizes: stage.Sizes, epochs: int, out: Path) -> list[str]:
    """The measurement's settings: none of them about speed."""
    val_images = sum(1 for _ in (root / "val").rglob("*.JPEG"))
    return [
        f"device={stage.device().type}",
        "experiment=imagenet",
        f"data.root={root}",
        f"data.global_batch={sizes.batch}",
        f"data.image_size={sizes.image}",
        f"data.eval_resize={max(sizes.image, 256 * sizes.image // 224)}",
        f"data.eval_batch={val_images}",
        f"run.max_epochs={epochs}",
        f"mlperf.first_eval={epochs}",
        f"mlperf.eval_every={epochs}",
        "mlperf.target_accuracy=1.0",
        "run.allow_not_converged=true",
        "run.checkpoint=false",
        "run.progress=lines",
        f"hydra.run.dir={out}",
    ]


def epoch_rates(metrics: Path) -> list[float]:
    """Each epoch's training rate as train.py wrote it into metrics.csv."""
    return [float(row["images_per_s"]) for row in MetricsCSV(metrics).read()]


def steady_rate(rates: list[float]) -> float:
    """The median epoch's rate after the first, whose batches wait for the workers to start."""
    return statistics.median(rates[1:] or rates)


def auto_line(output: str) -> str | None:
    """The line of train.py's output that says what data.decode=auto chose (None where it printed none)."""
    return next((line.strip() for line in output.splitlines() if line.strip().startswith(AUTO)), None)


def train_run(args: argparse.Namespace, sizes: stage.Sizes, name: str, extra: list[str]) -> stage.Figures:
    """One train.py run; its epoch rates, the median after the first, and what its MLPerf log says."""
    root = training_set(args.work, sizes, REPEAT[args.tiny])
    out = args.work / "train" / name.replace("=", "-")
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "train.py", *overrides(root, sizes, EPOCHS[args.tiny], out), *extra]
    env = {**os.environ, CACHE_ENV: str(args.work / "cache"), "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    finished = subprocess.run(command, env=env, text=True, capture_output=True, check=False)
    print(" ".join(command[1:]), finished.stdout[-3000:], finished.stderr[-3000:], sep="\n", flush=True)
    if finished.returncode != 0:
        raise RuntimeError(f"train.py exited {finished.returncode}: {finished.stderr.strip().splitlines()[-1:]}")
    rates = epoch_rates(out / rundir.METRICS)
    logged = summarize_run(rundir.mlperf_log(out))
    return {
        "img_s": round(steady_rate(rates), 1),
        "decode_auto": auto_line(finished.stdout),  # None where it said none
        "epoch_img_s": [round(rate, 1) for rate in rates],
        "log_train_img_s": round(logged.train_img_s, 1),
        "run_status": logged.status,
        "wall_s": round(time.perf_counter() - started, 1),
        "overrides": " ".join(extra) or "none",
    }


def fallback(work: Path) -> list[str]:
    """The settings the runs after a failed one take: the step stage's best where this machine's check measured
    it (settings proven on this GPU), else the eager step (the defaults without compile and CUDA graphs)."""
    return list(stage.recorded(work, "step").get("best") or step_stage.EAGER)


def run(args: argparse.Namespace, sizes: stage.Sizes) -> stage.Figures:
    """Each variant in turn; where the defaults fail, the others run with `fallback`'s settings instead, so that
    the stage still says what train.py achieves."""
    runs: stage.Figures = {}
    instead: list[str] = []
    figures: stage.Figures = {"batch": sizes.batch, "image": sizes.image, "epochs": EPOCHS[args.tiny], "runs": runs}
    for name, extra in VARIANTS.items():
        run_it = partial(train_run, args, sizes, name, [*instead, *extra])
        stage.attempt(name, run_it, figures, args.json, runs)
        if name in figures.get("failed", []):
            instead = instead or fallback(args.work)
    return figures


if __name__ == "__main__":
    sys.exit(stage.main(run))
