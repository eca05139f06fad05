"""Fit the cost model's free constants to Graphcore's MLPerf Training v1.1 IPU-POD16 result, then predict POD64.

Fitted, each from one POD16 figure (../shared/reference/ipu.md) in closed form or by bisection:
  compute_efficiency  <- training throughput (29,541 img/s)
  eval_overhead_s     <- "about 25 s" of evaluation after training
  run_overhead_s      <- time-to-train (28.335 min), after the epochs and the evaluations
The other constants stay as cost.Constants assumes them: with one micro-batch size and one accumulation count, the
POD16 figures cannot tell compute from the per-step costs (all-reduce latency, host sync), so fitting those too
would only trade one for another. POD64 (published 108,011 img/s, 8.504 min) is then a prediction.

    python -m backends.ipu_sim.calibrate      # the fitted constants, a table, one JSON line
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from backends.ipu_sim.cost import Constants, Projection, RunShape, evaluation_s, evaluations, project, step_time
from backends.ipu_sim.plan import Layout, plan_run
from backends.ipu_sim.profile import ModelProfile
from configs.hardware import System
from configs.schema import register
from models import batchnorm, build_resnet50


@dataclass(frozen=True)
class Published:
    """One MLPerf v1.1 result and the layout behind it (ipu.md; configs/experiment/mlperf_pod16.yaml and
    mlperf_pod64.yaml run the same layouts)."""

    system: str
    layout: Layout
    epochs: int
    throughput_img_s: float
    time_to_train_min: float

    @property
    def shape(self) -> RunShape:
        return self.layout.shape()


# 20 images per micro-batch on one IPU per replica, recomputation at block outputs, fp16.16, 8-bit input, one
# merged all-reduce. device_iterations is not in the published logs: 100 is assumed (host sync: 10 us per step).
RECIPE = Layout(replicas=16, micro_batch=20, grad_accum=10, image_size=224, recompute="auto", device_iterations=100)
POD16 = Published("ipu_pod16", RECIPE, 38, 29_541, 28.335)
POD64 = Published("ipu_pod64", dataclasses.replace(RECIPE, replicas=64, grad_accum=3), 38, 108_011, 8.504)
POD16_EVAL_S = 25.0  # ipu.md: evaluation of the saved checkpoints after training, "about 25 s on POD16"


def resnet50_profile(system: System) -> ModelProfile:
    """ResNet-50 v1.5 as the published runs laid it out, probed on the host (a few seconds). The POD16 and POD64
    layouts differ only in replicas and accumulation, which the probe does not see."""
    model = build_resnet50(1000, batchnorm(0.1, 1e-5), channels_last=True)
    return plan_run(model, RECIPE, system.chip).profile


def fit_compute_efficiency(
    profile: ModelProfile, system: System, shape: RunShape, constants: Constants, throughput: float
) -> float:
    """Bisect (in log space) for the efficiency at which the projected throughput meets the published one."""

    def reached(efficiency: float) -> float:
        step = step_time(profile, system, shape, dataclasses.replace(constants, compute_efficiency=efficiency))
        return shape.global_batch / step.total_s

    low, high = 1e-4, 1.0
    if reached(high) < throughput:
        raise ValueError(f"{system.name} cannot reach {throughput:,.0f} img/s even at the chip's peak")
    for _ in range(100):
        middle = (low * high) ** 0.5
        low, high = (middle, high) if reached(middle) < throughput else (low, middle)
    return high


def fit(profile: ModelProfile, pod16: System, assumed: Constants) -> Constants:
    """`assumed` with the three constants that reproduce POD16's throughput, evaluation time and time-to-train."""
    efficiency = fit_compute_efficiency(profile, pod16, POD16.shape, assumed, POD16.throughput_img_s)
    constants = dataclasses.replace(assumed, compute_efficiency=efficiency, eval_overhead_s=0.0, run_overhead_s=0.0)
    passes_s = evaluation_s(profile, pod16, POD16.shape, constants, 50_000)
    constants = dataclasses.replace(constants, eval_overhead_s=POD16_EVAL_S / evaluations(POD16.epochs) - passes_s)
    unexplained_s = 60 * (
        POD16.time_to_train_min - project_published(profile, pod16, POD16, constants).time_to_train_min
    )
    return dataclasses.replace(constants, run_overhead_s=unexplained_s)


def project_published(profile: ModelProfile, system: System, published: Published, constants: Constants) -> Projection:
    """The projection of a published run's shape and epochs."""
    return project(profile, system, published.shape, constants, epochs=published.epochs)


def load_system(name: str) -> System:
    """configs/device/<name>.yaml with its chip, composed by Hydra as a run would."""
    register()
    with initialize_config_module("configs", version_base="1.3"):
        cfg = compose("config", overrides=[f"device={name}"])
    return OmegaConf.to_object(cfg.device).system


def error(projected: float, published: float) -> float:
    """Relative error of a projection, in percent."""
    return 100 * (projected / published - 1)


def main() -> None:
    systems = {published.system: load_system(published.system) for published in (POD16, POD64)}
    profile = resnet50_profile(systems[POD16.system])
    constants = fit(profile, systems[POD16.system], Constants())
    print("fitted on ipu_pod16 (MLPerf Training v1.1, ResNet-50):")
    for name in ("compute_efficiency", "eval_overhead_s", "run_overhead_s"):
        print(f"  {name} = {getattr(constants, name):.4g}")
    print("assumed:")
    for name in ("memory_efficiency", "collective_latency_s", "loader_img_s_per_core", "host_sync_s"):
        print(f"  {name} = {getattr(constants, name):.4g}")
    print()
    header = f"{'system':<10} {'b x K x R':>10} {'img/s':>9} {'published':>10} {'error':>7}"
    print(header + f" {'TTT min':>8} {'published':>10} {'error':>7}   step ms: compute allreduce update sync host")
    summary = {name: getattr(constants, name) for name in ("compute_efficiency", "eval_overhead_s", "run_overhead_s")}
    for published in (POD16, POD64):
        p = project_published(profile, systems[published.system], published, constants)
        shape, step = published.shape, p.step
        throughput_error = error(p.throughput_img_s, published.throughput_img_s)
        ttt_error = error(p.time_to_train_min, published.time_to_train_min)
        batch = f"{shape.micro_batch}x{shape.grad_accum}x{shape.replicas}"
        print(
            f"{published.system:<10} {batch:>10} {p.throughput_img_s:>9,.0f} {published.throughput_img_s:>10,.0f}"
            f" {throughput_error:>+6.1f}% {p.time_to_train_min:>8.3f} {published.time_to_train_min:>10.3f}"
            f" {ttt_error:>+6.1f}%   {1e3 * step.compute_s:>15.2f} {1e3 * step.allreduce_s:>9.2f}"
            f" {1e3 * step.update_s:>6.3f} {1e3 * step.host_sync_s:>4.2f} {1e3 * step.host_feed_s:>4.1f}"
        )
        summary[published.system] = {
            "throughput_img_s": round(p.throughput_img_s),
            "throughput_error_pct": round(throughput_error, 2),
            "time_to_train_min": round(p.time_to_train_min, 3),
            "time_to_train_error_pct": round(ttt_error, 2),
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
