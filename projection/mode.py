"""run.mode=project: the simulated IPU system's memory plan and projected time-to-train (no data, no MLPerf log),
printed and kept in the run directory: projection.txt (all of it) and projection.json (its figures)."""

from __future__ import annotations

from pathlib import Path

import torch

import rundir
from backends.ipu_sim import simulator
from configs.schema import Config, batch_shape
from data.datasets import dataset_size
from projection.ipu import report
from projection.run import Schedule


def project(cfg: Config, out_dir: Path | None) -> None:
    """Probe the model on the host, then print the system's memory plan, the step time by component, and the
    projected epoch and time-to-train for run.max_epochs; write them into `out_dir` too (rank 0's)."""
    torch.manual_seed(cfg.run.seed)
    classes, train_images, eval_images = dataset_size(cfg.data)
    shape = batch_shape(cfg, world_size=1)  # a simulated system's replicas, whatever the ranks that project it
    plan = simulator.plan(cfg, shape, simulator.build_model(cfg, classes))
    mlperf = cfg.mlperf
    schedule = Schedule(cfg.run.max_epochs, train_images, eval_images, mlperf.eval_every, mlperf.first_eval)
    said, figures = report.project(plan, simulator.system_of(cfg), schedule).rsplit("\n", 1)
    if out_dir is not None:  # named before the figures, which stay the last line
        kept = f"{rundir.PROJECTION_TEXT}: all of this; {rundir.PROJECTION_JSON}: the last line"
        said += f"\noutputs: {out_dir} ({kept})"
    text = f"{said}\n{figures}"
    print(text, flush=True)
    if out_dir is not None:
        (out_dir / rundir.PROJECTION_TEXT).write_text(text + "\n")
        (out_dir / rundir.PROJECTION_JSON).write_text(figures + "\n")
