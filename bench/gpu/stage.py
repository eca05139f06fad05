"""What every stage of the GPU check shares: its command line, its sizes (full on a GPU, tiny in the rehearsal),
the config composed as train.py composes it, and its figures written as one JSON file."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from bench.folders import claim, is_ours, refuse
from configs.schema import Config, register, validate

Figures = dict[str, object]


@dataclass(frozen=True)
class Sizes:
    """How big each measurement is: the issue's sizes on a GPU, tiny ones for the CPU rehearsal."""

    batch: int
    image: int
    warmup: int
    steps: int
    photos: int
    workers: tuple[int, ...]


FULL = Sizes(batch=256, image=224, warmup=8, steps=30, photos=3840, workers=(4, 8, 15))
TINY = Sizes(batch=4, image=32, warmup=1, steps=2, photos=40, workers=(1, 2))


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def no_gpu(what: str) -> str:
    """The figure recorded where a measurement needs a GPU."""
    return f"skipped: {what} needs a CUDA device"


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def composed(overrides: list[str]) -> Config:
    """The run's Config from configs/ with `overrides`, composed and validated as train.py does it."""
    register()
    with initialize_config_module("configs", version_base="1.3"):
        cfg = OmegaConf.to_object(compose("config", overrides=overrides))
    validate(cfg)
    return cfg


def timed_steps(step: Callable[[], object], warmup: int, steps: int) -> float:
    """Seconds for `steps` calls of `step` after `warmup` untimed ones, the device drained at both ends."""
    for _ in range(warmup):
        step()
    synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize()
    return time.perf_counter() - started


def save(path: Path, figures: Figures) -> None:
    """The stage's figures so far: the check reads them even from a stage stopped at its time cap."""
    path.write_text(json.dumps(figures, indent=1))


def main(run: Callable[[argparse.Namespace, Sizes], Figures], argv: list[str] | None = None) -> int:
    """`python -m bench.gpu.<stage> --json FILE [--tiny] [--work DIR] ...`: run the stage, write its figures;
    exit status 1 where some of its measurements failed (their names under "failed")."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path, required=True, help="where the stage's figures go")
    parser.add_argument("--tiny", action="store_true", help="the CPU rehearsal's sizes")
    parser.add_argument("--work", type=Path, default=Path("build/gpu-work"), help="scratch shared by the stages")
    args = parser.parse_args(argv)
    if args.json.exists() and not is_ours(args.json.parent):
        refuse(f"--json {args.json} exists; the figures go to a new file, or into a bench's folder")
    claim(args.work, "--work")  # the stages remove and rewrite what they made there
    figures = run(args, TINY if args.tiny else FULL)
    save(args.json, figures)
    print(json.dumps(figures))
    return 1 if figures.get("failed") else 0
