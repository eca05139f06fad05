"""The IPU's ways to spread ResNet-50 over 16 IPUs, side by side on one simulated system at one micro-batch.

    python -m bench.ipu_cases [--system ipu_pod16] [--micro-batch 8] [--grad-accum 8] [--image-size 224]

Graphcore's software put a model on several IPUs three ways: sharding (the model cut across IPUs, one part after
another), replication (data-parallel copies) and pipelining (the parts of a sharded model working on different
micro-batches at once); replicas of pipelines combine the last two. Each case below is composed as
`python train.py run.mode=project` would compose it (experiment=mlperf_pod16, fp16, LARS) with the same micro-batch
and micro-batches per update, and planned by the simulator: the cuts chosen by device.pipeline_splits=auto, the
memory plan, and the step the calibrated cost model times. The table gives each case's throughput (its global batch
over its step) and per IPU it uses, the fullest IPU's memory and whether every IPU fits, and the share of the IPUs'
time in the compute that they are busy. The last line is JSON: each case's ipus, img_s, fullest_ipu_mb, fits,
busy_pct and cuts (or why no cut fits).

  sharded      1 replica on 4 IPUs, the stages in turn
  pipelined    1 replica on 4 IPUs, pipelined
  replicated   16 replicas on 1 IPU each, without and with recomputation
  combined     4 replicas of 4-stage pipelines
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from configs.checks import ConfigError
from configs.schema import Config, batch_shape, register, validate
from projection.ipu import cost, simulator
from projection.ipu.cost import Constants


@dataclass(frozen=True)
class Case:
    name: str
    replicas: int
    stages: int
    mode: str = "pipelined"
    recompute: str = "none"


CASES = (
    Case("sharded", 1, 4, "sharded"),
    Case("pipelined", 1, 4),
    Case("replicated", 16, 1),
    Case("replicated, recomputed", 16, 1, recompute="auto"),
    Case("combined (4 x 4)", 4, 4),
)


def configured(case: Case, system: str, micro_batch: int, grad_accum: int, image_size: int) -> Config:
    """The case as train.py composes and checks it."""
    overrides = [
        "run.mode=project",
        "experiment=mlperf_pod16",
        f"device={system}",
        f"device.replicas={case.replicas}",
        "device.pipeline_splits=" + ("auto" if case.stages > 1 else "[]"),
        f"device.ipus_per_replica={case.stages}",
        f"device.pipeline_mode={case.mode}",
        f"device.recompute={case.recompute}",
        f"dist.grad_accum={grad_accum}",
        "dist.bn_group_size=1",  # each replica its own BatchNorm statistics, in every case
        f"data.global_batch={micro_batch * grad_accum * case.replicas}",
        f"data.image_size={image_size}",
        f"data.eval_resize={max(image_size, 256 * image_size // 224)}",
    ]
    register()
    with initialize_config_module("configs", version_base="1.3"):
        cfg = OmegaConf.to_object(compose("config", overrides=overrides))
    assert isinstance(cfg, Config)
    validate(cfg)
    return cfg


def measure(cfg: Config) -> dict[str, object]:
    """The case's cuts, memory and step, as run.mode=project plans them."""
    shape = batch_shape(cfg, world_size=1)
    model = simulator.build_model(cfg, 1000)
    try:
        planned = simulator.plan(cfg, shape, model)
    except ConfigError as err:  # auto found no cut that fits
        return {"ipus": None, "img_s": None, "fullest_ipu_mb": None, "fits": False, "busy_pct": None, "cuts": str(err)}
    step = cost.step_time(planned.profile, simulator.system_of(cfg), planned.layout.shape(), Constants())
    return {
        "ipus": cfg.device.replicas * len(planned.profile.stages),
        "img_s": round(shape.global_batch / step.total_s, 1),
        "fullest_ipu_mb": round(max(row.total_mb for row in planned.memory.rows), 1),
        "fits": planned.memory.fits,
        "busy_pct": round(100 * step.busy, 1),
        "cuts": list(planned.layout.splits),
    }


def table(figures: dict[str, dict[str, object]], system: str, micro_batch: int, grad_accum: int) -> str:
    lines = [
        f"ResNet-50 on {system}, {micro_batch} images per micro-batch, {grad_accum} micro-batches per update",
        f"{'case':<24}{'IPUs':>5}{'img/s':>10}{'per IPU':>9}{'fullest IPU MB':>16}{'fits':>6}{'IPUs busy %':>13}  cuts",
    ]
    for name, row in figures.items():
        ipus = "-" if row["ipus"] is None else f"{row['ipus']}"
        rate = "-" if row["img_s"] is None else f"{row['img_s']:,.0f}"
        per_ipu = "-" if row["img_s"] is None else f"{row['img_s'] / row['ipus']:,.0f}"
        memory = "-" if row["fullest_ipu_mb"] is None else f"{row['fullest_ipu_mb']:,.0f}"
        busy = "-" if row["busy_pct"] is None else f"{row['busy_pct']:.0f}"
        cuts = row["cuts"] if isinstance(row["cuts"], str) else ",".join(row["cuts"]) or "(one IPU)"
        fits = "yes" if row["fits"] else "no"
        lines.append(f"{name:<24}{ipus:>5}{rate:>10}{per_ipu:>9}{memory:>16}{fits:>6}{busy:>13}  {cuts}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", default="ipu_pod16")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--grad-accum", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args(argv)
    figures = {
        case.name: measure(configured(case, args.system, args.micro_batch, args.grad_accum, args.image_size))
        for case in CASES
    }
    print(table(figures, args.system, args.micro_batch, args.grad_accum))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
