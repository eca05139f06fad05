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

import argparse
import contextlib
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, partial

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from backends.ipu_sim.cost import Constants, Projection, RunShape, evaluation_s, evaluations, project, step_time
from backends.ipu_sim.plan import Layout, plan_run
from backends.ipu_sim.profile import ModelProfile
from backends.ipu_sim.uncertainty import ASSUMPTIONS, Assumption, Interval, Refit, describe, figures, interval
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
FITTED = ("compute_efficiency", "eval_overhead_s", "run_overhead_s")
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


def refitter(profile: ModelProfile, pod16: System) -> Refit:
    """`fit` to POD16 for any assumed constants, each set fitted once: the refit depends on nothing else, and
    every interval refits the same 512 corners and 18 ends."""
    return cache(partial(fit, profile, pod16))


def load_system(name: str) -> System:
    """configs/device/<name>.yaml with its chip, composed by Hydra as a run would."""
    register()
    inside_a_run = GlobalHydra.instance().is_initialized()  # run.mode=project: compose on the run's search path
    with contextlib.nullcontext() if inside_a_run else initialize_config_module("configs", version_base="1.3"):
        cfg = compose("config", overrides=[f"device={name}"])
    system = OmegaConf.to_object(cfg.device.system)
    assert isinstance(system, System)
    return system


def error(projected: float, published: float) -> float:
    """Relative error of a projection, in percent."""
    return 100 * (projected / published - 1)


SYSTEMS = {
    "gc200": ("ipu_pod16", "ipu_pod64", "ipu_pod128", "ipu_pod256"),
    "bow": ("bow_pod16", "bow_pod64", "bow_pod128", "bow_pod256"),
}


def print_constants(constants: Constants) -> None:
    print("fitted on ipu_pod16 (MLPerf Training v1.1, ResNet-50):")
    for name in FITTED:
        print(f"  {name} = {getattr(constants, name):.4g}")
    print("assumed, with the range each projection is repeated over (backends/ipu_sim/uncertainty.py):")
    for name, assumption in ASSUMPTIONS.items():
        print(f"  {describe(name, assumption, getattr(constants, name))}: {assumption.reason}")
    print()


def print_calibration(profile: ModelProfile, constants: Constants, refit: Refit) -> None:
    """The fit, and the POD64 prediction with its range beside the published figures."""
    print_constants(constants)
    print(f"{'system':<10} {'b x K x R':>10} {'img/s':>9} {'range':>17} {'published':>10} {'error':>7}", end="")
    print(f" {'TTT min':>8} {'range':>15} {'published':>10} {'error':>7}")
    summary: dict[str, object] = {name: getattr(constants, name) for name in FITTED}
    for published in (POD16, POD64):
        system = load_system(published.system)
        spread = interval(partial(project_published, profile, system, published), refit, constants)
        projection = spread.central
        throughput_error = error(projection.throughput_img_s, published.throughput_img_s)
        ttt_error = error(projection.time_to_train_min, published.time_to_train_min)
        shape = published.shape
        low, high = spread.throughput_img_s
        first, last = spread.time_to_train_min
        print(
            f"{published.system:<10} {f'{shape.micro_batch}x{shape.grad_accum}x{shape.replicas}':>10}"
            f" {projection.throughput_img_s:>9,.0f} {f'{low:,.0f}-{high:,.0f}':>17}"
            f" {published.throughput_img_s:>10,.0f} {throughput_error:>+6.1f}%"
            f" {projection.time_to_train_min:>8.3f} {f'{first:.3f}-{last:.3f}':>15}"
            f" {published.time_to_train_min:>10.3f} {ttt_error:>+6.1f}%"
        )
        summary[published.system] = figures(spread) | {
            "throughput_error_pct": round(throughput_error, 2),
            "time_to_train_error_pct": round(ttt_error, 2),
        }
    print(json.dumps(summary))


# StepTime's fields less "_s", those that change with scale: exchange is 0 (the recipe has no pipeline) and host_sync
# one host round trip per device_iterations updates.
STEP_TERMS = ("compute", "allreduce", "gateway", "update", "sync", "host_feed")


def scaled(
    profile: ModelProfile,
    system: System,
    constants: Constants,
    refit: Refit,
    grad_accum: int,
    epochs: float,
    assumptions: Mapping[str, Assumption] = ASSUMPTIONS,
) -> Interval:
    """The recipe's micro-batch with `grad_accum` micro-batches per update, one replica per IPU of `system`."""
    shape = dataclasses.replace(RECIPE, replicas=system.ipus, grad_accum=grad_accum).shape()

    def at(assumed: Constants) -> Projection:
        return project(profile, system, shape, assumed, epochs=epochs)

    return interval(at, refit, constants, assumptions)


def print_scaling(profile: ModelProfile, constants: Constants, refit: Refit, grad_accum: int, epochs: float) -> None:
    """One recipe shape (20 images x K per replica, one IPU each) on every system of both chips: throughput per
    IPU, time-to-train and every step-time component, so where efficiency goes with size shows."""
    print_constants(constants)
    print(f"scaling: 20 images x {grad_accum} micro-batches per replica, one IPU per replica, {epochs:g} epochs")
    header = f"{'system':<11} {'IPUs':>4} {'img/s/IPU':>9} {'range':>11} {'vs 16':>6} {'TTT min':>7} {'range':>11}"
    print(header + "   step ms:" + "".join(f"{term:>10}" for term in STEP_TERMS))
    summary: dict[str, object] = {}
    for names in SYSTEMS.values():
        smallest = None
        for name in names:
            system = load_system(name)
            spread = scaled(profile, system, constants, refit, grad_accum, epochs)
            projection = spread.central
            per_ipu = projection.throughput_img_s / system.ipus
            smallest = smallest or per_ipu
            low, high = (value / system.ipus for value in spread.throughput_img_s)
            first, last = spread.time_to_train_min
            step_ms = {term: 1e3 * getattr(projection.step, f"{term}_s") for term in STEP_TERMS}
            print(
                f"{name:<11} {system.ipus:>4} {per_ipu:>9,.0f} {f'{low:,.0f}-{high:,.0f}':>11}"
                f" {per_ipu / smallest:>6.3f} {projection.time_to_train_min:>7.2f} {f'{first:.2f}-{last:.2f}':>11}"
                + " " * 13
                + "".join(f"{value:>10.3f}" for value in step_ms.values())
            )
            summary[name] = figures(spread) | {
                "img_s_per_ipu": round(per_ipu, 1),
                "step_ms": {term: round(value, 4) for term, value in step_ms.items()},
            }
    print(json.dumps(summary))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scaling", action="store_true", help="project 16 to 256 IPUs of both chips")
    parser.add_argument("--grad-accum", type=int, default=2, help="micro-batches per update in --scaling")
    parser.add_argument("--epochs", type=float, default=38, help="epochs to train in --scaling")
    args = parser.parse_args(argv)
    pod16 = load_system(POD16.system)
    profile = resnet50_profile(pod16)
    refit = refitter(profile, pod16)
    constants = refit(Constants())
    if args.scaling:
        print_scaling(profile, constants, refit, args.grad_accum, args.epochs)
    else:
        print_calibration(profile, constants, refit)


if __name__ == "__main__":
    main()
