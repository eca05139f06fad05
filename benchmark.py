"""run.mode=benchmark: time the train step on random in-memory batches (no data, no MLPerf log)."""

from __future__ import annotations

import json
import time

import torch

import distributed
from backends.base import RunFacts
from configs.schema import Config
from data.datasets import dataset_size
from models import random_batch
from projection import families


def benchmark(cfg: Config, facts: RunFacts) -> None:
    """A warm-up step, then run.benchmark_steps timed ones; rank 0 prints the figures and one JSON line."""
    topology, device, policy = facts.topology, facts.device, facts.policy
    distributed.seed_everything(cfg.run.seed, topology.rank)
    classes, _, _ = dataset_size(cfg.data)
    backend = families.build_backend(cfg, facts, classes)
    batch, size = facts.shape.per_rank, cfg.data.image_size
    images, labels = random_batch(batch, size, classes)
    lr = cfg.optim.base_lr / 100  # small enough to stay finite however long it runs
    float(backend.train_step(images, labels, lr))  # warm-up: allocations, kernel selection
    started = time.perf_counter()
    losses = [backend.train_step(images, labels, lr) for _ in range(cfg.run.benchmark_steps)]
    float(torch.stack(losses).sum())  # wait for the device
    distributed.barrier()
    images_per_s = cfg.run.benchmark_steps * cfg.data.global_batch / (time.perf_counter() - started)
    if not topology.is_main:
        return
    batches = f"batch {cfg.data.global_batch}" + (f" ({topology.world_size} ranks)" if topology.distributed else "")
    print(f"precision {policy.describe()}")
    print(f"{cfg.run.benchmark_steps} steps of {batches} at {size} px on {device}: {images_per_s:.1f} img/s")
    figures = {"img_s": round(images_per_s, 2), "precision": policy.name, "batch": cfg.data.global_batch}
    figures |= {"ranks": topology.world_size, "image_size": size, "optimizer": cfg.optim.name}
    print(json.dumps({**figures, "device": str(device)}))
