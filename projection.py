"""run.mode=project: the simulated IPU system's memory plan and projected time-to-train (no data, no MLPerf log)."""

from __future__ import annotations

import torch

from assemble import build_model, dataset_shape, ipu_plan
from backends.ipu_sim import simulator
from configs.schema import Config


def project(cfg: Config) -> None:
    """Probe the model on the host, then print the system's memory plan, the step time by component, and the
    projected epoch and time-to-train for run.max_epochs."""
    torch.manual_seed(cfg.run.seed)
    classes, train_images, eval_images = dataset_shape(cfg)
    plan = ipu_plan(cfg, build_model(cfg, classes))
    workload = simulator.Workload(cfg.run.max_epochs, train_images, eval_images, cfg.mlperf.eval_every)
    simulator.project(plan, cfg.device.system, workload)
