"""Fit the cost model's free constants to Graphcore's MLPerf Training v1.1 IPU-POD16, POD64 and POD128 results.

The in-sample systems are Graphcore's v1.1 IPU-POD16, POD64 and POD128; their result logs
(mlcommons/training_results_v1.1, Graphcore/results/ipu-pod{16,64,128}-TF1/resnet/result_0..4.txt) time every epoch
and evaluation. Fitted, in closed form, each to what only it explains:
  compute_efficiency  <- POD16's steady epoch (10 micro-batches per update) against POD64's (3): the per-micro-batch
  update_overhead_s   <- cost and the per-update cost; every other term of the step is modelled or assumed
  gateway_efficiency  <- POD128's steady epoch: the only in-sample system that spans POD64s
  eval_overhead_s     <- the three systems' evaluations, beyond their forward passes (mean residual)
A steady epoch is a logged epoch with no checkpoint in it or before it (median over the five runs). The checkpoint
and evaluation costs are read off the same logs (projection/ipu/assumptions.py). IPU-POD256 and every Bow system
are held out: no constant or range is taken from them.

Leave-one-out: each in-sample system projected from a fit to the other two, its own results unseen, with the range it
would have been given. Two systems leave one constant unidentified, held at a prior from the hardware (PRIORS):
without POD128 the gateway's efficiency; without POD16 or POD64 the update overhead (one run within a POD64 cannot
split it from the per-micro-batch cost), the efficiency then from the one left and the gateway from POD128. The three
errors size every IPU projection's ranges (the evidence: a Student t prediction interval holding COVERAGE).

    python -m projection.ipu.calibrate             # the fit, the in-sample residuals, leave-one-out, one JSON line
    python -m projection.ipu.calibrate --scaling   # 16 to 256 IPUs of both chips, each term's share
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, cached_property

from models import batchnorm, build_resnet50
from projection import calibration
from projection.calibration import Columns, device_section, half_widths
from projection.ipu.assumptions import ASSUMPTIONS
from projection.ipu.config import IpuSimConfig, System
from projection.ipu.cost import (
    Constants,
    Projection,
    RunShape,
    eval_image_s,
    host_calls_per_epoch,
    pods,
    project,
    step_time,
)
from projection.ipu.plan import Layout, plan_run
from projection.profile import ModelProfile
from projection.run import Schedule
from projection.uncertainty import COVERAGE, Assumption, Interval, Refit, column, figures, interval, widened

Published = calibration.Published[Layout]  # ipu.md's figures; the layout and schedule from configs.yml


def shape(published: Published) -> RunShape:
    return published.layout.shape(published.schedule.train_images)


# 20 images per micro-batch on one IPU per replica, recomputation (the recipe's pipeline stages all on one IPU),
# fp16.16, 8-bit input, merged all-reduce; host round trips per train.py's log interval. Throughput: 1,281,167 over
# the median epoch; a steady epoch has no checkpoint in it or before it; an evaluation is a later one's
# eval_start to eval_stop.
RECIPE = Layout(replicas=16, micro_batch=20, grad_accum=10, image_size=224, recompute="auto")
POD16 = Published("ipu_pod16", "ipu_pod16", RECIPE, Schedule(38, first_eval=2), 29_541, 28.335, 43.217, 0.535)
POD64 = Published(
    "ipu_pod64", "ipu_pod64", dataclasses.replace(RECIPE, replicas=64, grad_accum=3), Schedule(38, first_eval=2),
    108_011, 8.504, 11.850, 0.343,
)  # fmt: skip
POD128 = Published(
    "ipu_pod128", "ipu_pod128", dataclasses.replace(RECIPE, replicas=128, grad_accum=2), Schedule(41, first_eval=1),
    178_187, 5.672, 6.905, 0.260,
)  # fmt: skip
IN_SAMPLE = (POD16, POD64, POD128)
FITTED = {  # each fitted constant and the systems that constrain it
    "compute_efficiency": "ipu_pod16, ipu_pod64",
    "update_overhead_s": "ipu_pod16, ipu_pod64",
    "gateway_efficiency": "ipu_pod128",
    "eval_overhead_s": "ipu_pod16, ipu_pod64, ipu_pod128",
}


@cache
def resnet50_profile() -> ModelProfile:
    """ResNet-50 v1.5 as the published runs laid it out, probed on the host once per process (a few seconds). The
    in-sample layouts differ only in replicas and accumulation, which the probe does not see, and the profile not
    by chip."""
    model = build_resnet50(1000, batchnorm(0.1, 1e-5), channels_last=True)
    return plan_run(model, RECIPE, load_system(POD16.device).chip).profile


def load_system(name: str) -> System:
    """configs/device/<name>.yaml's simulated IPU system with its chip."""
    return device_section(name, IpuSimConfig).chosen_system


def target_s(published: Published) -> float:
    """One update of the published run: the steady epoch over its updates (whole round trips, as train.py logs)."""
    run = shape(published)
    return published.steady_epoch_s / (host_calls_per_epoch(published.schedule, run) * run.device_iterations)


@dataclass(frozen=True)
class Prior:
    """A fitted constant's value where the systems a fit is given leave it unidentified (leave-one-out), and why."""

    value: float
    reason: str


# Set before any leave-one-out fit was seen, from the hardware alone; none is taken from a published result.
PRIORS = {
    "update_overhead_s": Prior(
        1.6e-3,
        "ResNet-50's 161 parameter tensors x 10 LARS compute sets each (two norms, the trust ratio, momentum, weight)"
        " x 1 us a compute set (its sync, a small exchange and the vertices' launch: about 1,300 cycles)",
    ),
    "gateway_efficiency": Prior(
        0.5,
        "half the GW-Links' line rate: a RoCE collective of sub-MB shards, through a PCIe Gen4 x8 hop each way",
    ),
}


class IpuCalibration(calibration.Calibration[Constants, Projection, Layout]):
    """The IPU cost model's calibration on Graphcore's three v1.1 results, each constant in closed form from what
    only it explains; two systems leave one at its prior (PRIORS)."""

    in_sample = IN_SAMPLE
    fitted = FITTED
    assumptions = ASSUMPTIONS
    fitted_on = "ipu_pod16, ipu_pod64 and ipu_pod128 (MLPerf Training v1.1, ResNet-50)"
    evidence_source = f"leave-one-out over {', '.join(published.system for published in IN_SAMPLE)}"
    columns = Columns(rate=9, rates=17, minutes=15, missed=" NO ")
    left_out_title = f"leave-one-out: each system projected from a fit to the other two ({100 * COVERAGE:.0f} % ranges)"
    what_throughput_is = (
        ": 1,281,167 images over the median logged epoch; a fit matches the steady ones of the systems it is on"
    )

    @cached_property
    def profile(self) -> ModelProfile:
        return resnet50_profile()

    @cached_property
    def systems(self) -> dict[str, System]:
        """The systems Graphcore's in-sample results ran on, composed from configs/device/ once per process."""
        return {published.device: load_system(published.device) for published in IN_SAMPLE}

    def assumed(self) -> Constants:
        return Constants()

    def project_published(self, published: Published, constants: Constants) -> Projection:
        return project(self.profile, self.systems[published.device], shape(published), constants, published.schedule)

    def per_update_s(self, published: Published, constants: Constants) -> float:
        """The device time of one update in the published run, host round trip share included (the fit checks that
        the host feed, which overlaps it, does not bind)."""
        return step_time(self.profile, self.systems[published.device], shape(published), constants).device_s

    def device_bound(self, constants: Constants, fitted_on: Sequence[Published]) -> bool:
        """Whether every run fitted on is bound by its IPUs, not by its hosts' feed, as the logs' rates imply."""
        steps = (step_time(self.profile, self.systems[p.device], shape(p), constants) for p in fitted_on)
        return all(step.device_s >= step.host_feed_s for step in steps)

    def spans_pods(self, published: Published) -> bool:
        """Whether the published run spans more than one POD64, and so pays the cross-POD phase."""
        return pods(self.systems[published.device], shape(published), 1) > 1

    def fit(self, assumed: Constants, systems: Sequence[Published]) -> Constants | None:
        fitted = self.fit_step(assumed, systems)
        if fitted is None:
            return None
        overhead = self.fit_eval_overhead(fitted, systems)
        return dataclasses.replace(fitted, eval_overhead_s=overhead) if overhead >= 0 else None

    def fit_step(self, assumed: Constants, fitted_on: Sequence[Published]) -> Constants | None:
        """compute_efficiency and update_overhead_s from two runs within a POD64 (POD16's 10 micro-batches an update
        against POD64's 3), or with one, the overhead at its prior and the efficiency from that one; then
        gateway_efficiency from the run that spans POD64s, or at its prior without one. None where the assumed
        constants leave no physical fit (efficiency outside (0, 1], a negative overhead, a host-bound run)."""
        within = [published for published in fitted_on if not self.spans_pods(published)]
        across = [published for published in fitted_on if self.spans_pods(published)]
        if len(within) == 2:
            fitted = self.fit_compute_and_overhead(assumed, *within)
        else:
            (alone,) = within
            prior = dataclasses.replace(assumed, update_overhead_s=PRIORS["update_overhead_s"].value)
            fitted = self.fit_compute(prior, alone)
        if fitted is None:
            return None
        efficiency = self.fit_gateway(fitted, *across) if across else PRIORS["gateway_efficiency"].value
        if efficiency is None:
            return None
        fitted = dataclasses.replace(fitted, gateway_efficiency=efficiency)
        return fitted if self.device_bound(fitted, fitted_on) else None

    def fit_compute_and_overhead(self, assumed: Constants, first: Published, second: Published) -> Constants | None:
        """compute_efficiency and update_overhead_s in closed form from two runs of different accumulation within a
        POD64: the step is linear in 1/efficiency and in the overhead while compute-bound."""

        def at(published: Published, inverse_efficiency: float, overhead: float) -> float:
            trial = dataclasses.replace(assumed, compute_efficiency=1 / inverse_efficiency, update_overhead_s=overhead)
            return self.per_update_s(published, trial)

        rows = []
        for published in (first, second):
            base, doubled = at(published, 1.0, 0.0), at(published, 2.0, 0.0)
            rows.append((doubled - base, 2 * base - doubled, target_s(published)))
        (slope1, rest1, t1), (slope2, rest2, t2) = rows
        inverse_efficiency = (t1 - t2 - rest1 + rest2) / (slope1 - slope2)
        overhead = t1 - slope1 * inverse_efficiency - rest1
        if inverse_efficiency < 1 or overhead < 0:
            return None
        return dataclasses.replace(assumed, compute_efficiency=1 / inverse_efficiency, update_overhead_s=overhead)

    def fit_compute(self, assumed: Constants, published: Published) -> Constants | None:
        """compute_efficiency alone from one run, the overhead given: the update is linear in 1/efficiency."""

        def update(inverse: float) -> float:
            return self.per_update_s(published, dataclasses.replace(assumed, compute_efficiency=1 / inverse))

        at_peak = update(1.0)
        inverse = 1 + (target_s(published) - at_peak) / (update(2.0) - at_peak)
        return dataclasses.replace(assumed, compute_efficiency=1 / inverse) if inverse >= 1 else None

    def fit_gateway(self, constants: Constants, published: Published) -> float | None:
        """The GW-Link efficiency at which the run spanning POD64s takes its logged update, in closed form: the
        update is linear in 1 / efficiency (only the cross-POD phase's bandwidth term depends on it). None outside
        1e-4 to 1: even line rate too slow, or no efficiency above 1e-4 slows it enough."""

        def update(inverse: float) -> float:
            return self.per_update_s(published, dataclasses.replace(constants, gateway_efficiency=1 / inverse))

        at_line_rate, slope = update(1.0), update(2.0) - update(1.0)
        if slope <= 0:
            return None
        inverse = 1 + (target_s(published) - at_line_rate) / slope
        return 1 / inverse if 1.0 <= inverse <= 1e4 else None

    def fit_eval_overhead(self, constants: Constants, fitted_on: Sequence[Published]) -> float:
        """The mean, over the runs fitted on, of a logged evaluation less its forward passes."""
        residuals = [
            published.evaluation_s
            - published.schedule.eval_images
            * eval_image_s(self.profile, self.systems[published.device], shape(published), constants)
            for published in fitted_on
        ]
        return sum(residuals) / len(residuals)

    def refitter(self, systems: Sequence[Published]) -> Refit[Constants]:
        """The systems fitted on run at FITTED_CLOCK_HZ, where update_cycles_share moves nothing, so its ends share
        one fit."""
        fitted = super().refitter(systems)

        def refit(assumed: Constants) -> Constants | None:
            constants = fitted(dataclasses.replace(assumed, update_cycles_share=Constants.update_cycles_share))
            if constants is None:
                return None
            return dataclasses.replace(constants, update_cycles_share=assumed.update_cycles_share)

        return refit

    def unidentified(self, left_out: Published) -> str:
        """What the fit on the others holds at its prior: the gateway's efficiency where no run spans POD64s, else
        the update overhead (one run within a POD64 cannot split the per-micro-batch cost from the per-update one)."""
        if any(self.spans_pods(published) for published in self.others(left_out)):
            return "update_overhead_s"
        return "gateway_efficiency"

    def lead(self, published: Published | None, left_out: bool) -> str:
        if published is None:
            return f"{'left out':<10} {'at its prior':<18}" if left_out else f"{'system':<10} {'b x K x R':>10}"
        if left_out:
            return f"{published.system:<10} {self.unidentified(published):<18}"
        run = shape(published)
        return f"{published.system:<10} {f'{run.micro_batch}x{run.grad_accum}x{run.replicas}':>10}"

    def trailing(self, published: Published | None, projection: Projection | None) -> str:
        if published is None or projection is None:
            return f" {'steady epoch s':>15}"
        return f" {f'{projection.steady_epoch_s:.3f} / {published.steady_epoch_s:.3f}':>15}"

    def left_out_figures(self, published: Published) -> dict[str, object]:
        return {"prior": self.unidentified(published)}

    def left_out_summary(
        self, systems: dict[str, object], spreads: Sequence[Interval[Projection]]
    ) -> dict[str, object]:
        """The half-widths the three errors give every projection, the median of the ranges' and the priors."""
        found = self.evidence
        widths = [100 * width for spread in spreads for width in half_widths(spread)]
        print(
            f"the model's error off its fit, from these three: +-{100 * found.throughput:.1f} % throughput,"
            f" +-{100 * found.time_to_train:.1f} % time to train ({100 * COVERAGE:.0f} % Student t prediction"
            f" interval, {len(spreads)} degrees of freedom), which widens every projection's ranges"
        )
        print(f"median half-width of the leave-one-out ranges above: {statistics.median(widths):.1f} %")
        for name, prior in PRIORS.items():
            print(f"  prior {name} = {prior.value:g}: {prior.reason}")
        return systems | {
            "half_width_pct": {
                "throughput": round(100 * found.throughput, 2),
                "time_to_train": round(100 * found.time_to_train, 2),
            },
            "median_half_width_pct": round(statistics.median(widths), 2),
        }


CALIBRATION = IpuCalibration()  # the fit on the in-sample systems, once per process

SYSTEMS = {
    "gc200": ("ipu_pod16", "ipu_pod64", "ipu_pod128", "ipu_pod256"),
    "bow": ("bow_pod16", "bow_pod64", "bow_pod128", "bow_pod256"),
}


def recipe_schedule(system: System, epochs: int) -> Schedule:
    """Graphcore's v1.1 schedule: the first checkpoint at epoch 2 within a POD64, at epoch 1 beyond (configs.yml); a
    v2.0 system counts its checkpoints back from the last epoch instead (cost.checkpoint_schedule)."""
    return Schedule(epochs, first_eval=2 if system.ipus <= system.chip.ipus_per_pod else 1)


def scaled(
    system: System, grad_accum: int, epochs: int, assumptions: Mapping[str, Assumption] = ASSUMPTIONS
) -> Interval[Projection]:
    """The recipe's micro-batch with `grad_accum` micro-batches per update, one replica per IPU of `system`."""
    run = dataclasses.replace(RECIPE, replicas=system.ipus, grad_accum=grad_accum).shape()

    def at(assumed: Constants) -> Projection:
        return project(CALIBRATION.profile, system, run, assumed, recipe_schedule(system, epochs))

    return interval(at, CALIBRATION.refit, CALIBRATION.central, assumptions)


def shares(projection: Projection, epochs: int) -> tuple[dict[str, float], dict[str, float]]:
    """Each term's share of an update, and of an epoch on average (the run's training time over its epochs), by
    what it is paid per: per micro-batch, per update, per host round trip, per checkpoint; in %."""
    step = projection.step
    per_update = {term: 100 * getattr(step, f"{term}_s") / step.total_s for term in STEP_TERMS}
    steps_share = 100 * epochs * projection.steady_epoch_s / projection.training_s
    micro_batches, round_trips = (
        steps_share * seconds / step.total_s for seconds in (step.compute_s, step.host_sync_s)
    )
    per_epoch = {
        "micro-batch": micro_batches,
        "update": steps_share - micro_batches - round_trips,
        "round trip": round_trips,
        "checkpoint": 100 - steps_share,
    }
    return per_update, per_epoch


# StepTime's fields less "_s" that change with scale: exchange is 0 (the recipe has no pipeline).
STEP_TERMS = ("compute", "allreduce", "gateway", "update", "sync", "host_sync")


def print_scaling(grad_accum: int, epochs: int) -> None:
    """One recipe shape (20 images x K per replica, one IPU each) on every system of both chips: throughput per
    IPU and time-to-train with their ranges as run.mode=project gives them, each step term's share of an update, and
    an epoch's time by what it is paid per."""
    print(CALIBRATION.constants_table())
    print(f"scaling: 20 images x {grad_accum} micro-batches per replica, one IPU per replica, {epochs:g} epochs")
    header = f"{'system':<11} {'IPUs':>4} {'img/s/IPU':>9} {'range':>11} {'vs 16':>6} {'TTT min':>7} {'range':>11}"
    print(header + "  % of an update:" + "".join(f"{term:>10}" for term in STEP_TERMS), end="")
    print("  % of an epoch, paid per: micro-batch update round-trip checkpoint")
    summary: dict[str, object] = {}
    widths = []
    for names in SYSTEMS.values():
        smallest = None
        for name in names:
            system = load_system(name)
            spread = widened(scaled(system, grad_accum, epochs), CALIBRATION.evidence)
            projection = spread.central
            per_ipu = projection.throughput_img_s / system.ipus
            smallest = smallest or per_ipu
            low, high = (value / system.ipus for value in spread.throughput_img_s)
            per_update, per_epoch = shares(projection, epochs)
            print(
                f"{name:<11} {system.ipus:>4} {per_ipu:>9,.0f} {column(low, high, '{:,.0f}'.format):>11}"
                f" {per_ipu / smallest:>6.3f} {projection.time_to_train_min:>7.2f}"
                f" {column(*spread.time_to_train_min, '{:.2f}'.format):>11}"
                + " " * 16
                + "".join(f"{value:>10.2f}" for value in per_update.values())
                + " " * 20
                + "".join(f"{value:>10.2f}" for value in per_epoch.values())
            )
            widths += [100 * width for width in half_widths(spread)]
            summary[name] = figures(spread) | {
                "img_s_per_ipu": round(per_ipu, 1),
                "update_share_pct": {term: round(value, 3) for term, value in per_update.items()},
                "epoch_share_pct": {term: round(value, 3) for term, value in per_epoch.items()},
            }
    found = CALIBRATION.evidence
    print(
        f"({100 * COVERAGE:.0f} % ranges: the assumptions' range widened by the model's error off its fit,"
        f" +-{100 * found.throughput:.1f} % throughput and +-{100 * found.time_to_train:.1f} % time to train,"
        f" {found.source}; median half-width {statistics.median(widths):.1f} %)"
    )
    print(json.dumps(summary))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scaling", action="store_true", help="project 16 to 256 IPUs of both chips")
    parser.add_argument("--grad-accum", type=int, default=2, help="micro-batches per update in --scaling")
    parser.add_argument("--epochs", type=int, default=41, help="epochs to train in --scaling")
    args = parser.parse_args(argv)
    if args.scaling:
        print_scaling(args.grad_accum, args.epochs)
    else:
        calibration.print_calibration(CALIBRATION)


if __name__ == "__main__":
    main()
