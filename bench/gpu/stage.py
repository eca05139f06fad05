"""What every stage of the GPU check shares: its command line, its sizes (full on a GPU, tiny in the rehearsal),
the config composed as train.py composes it, and its figures written as one JSON file."""

from __future__ import annotations

import argparse
import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from bench.folders import claim, is_ours, refuse
from configs.schema import Config, register, validate
from data.loading.loader import workers_for_cores

Figures = dict[str, object]


@dataclass(frozen=True)
class Sizes:
    """How big each measurement is: the issue's sizes on a GPU, tiny ones for the CPU rehearsal."""

    batch: int
    image: int
    warmup: int
    steps: int
    photos: int
    workers: tuple[int, ...]  # the loader's worker counts, the last (and most) every core but one on a GPU
    batches: tuple[int, ...] = ()  # the best step's larger batches, in the order measured


ALL_WORKERS = max(1, workers_for_cores(local_ranks=1))  # data.workers=null's count on one rank (at least one)
FULL = Sizes(
    batch=256,
    image=224,
    warmup=8,
    steps=30,
    photos=3840,
    workers=tuple(sorted({min(4, ALL_WORKERS), min(8, ALL_WORKERS), ALL_WORKERS})),
    batches=(400, 384),  # NVIDIA's MLPerf recipe trains 400 per H200
)
TINY = Sizes(batch=4, image=32, warmup=1, steps=2, photos=40, workers=(1, 2), batches=(8, 6))


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


def recorded(work: Path, name: str) -> Figures:
    """The figures stage `name` wrote into WORK ({} where it has not run)."""
    path = work / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def attempt(
    name: str, measure: Callable[[], object], figures: Figures, path: Path, into: Figures | None = None
) -> None:
    """into[name] = measure() (`into` is `figures` where not given, or a table of it), or where it raises, why:
    its name then joins figures["failed"]. The stage's `figures` are saved to `path` at once either way, so that
    one measurement's failure, or the stage's time cap, costs the others nothing."""
    into = figures if into is None else into
    try:
        into[name] = measure()
    except ModuleNotFoundError as err:
        into[name] = f"skipped: {err}"
    except Exception as err:  # one measurement's failure must not cost the others their figures
        traceback.print_exc()
        into[name] = f"failed: {type(err).__name__}: {err}"[:300]
        figures["failed"] = [*figures.get("failed", []), name]
    print(name, into[name], flush=True)
    save(path, figures)


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
