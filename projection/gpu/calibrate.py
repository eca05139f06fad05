"""Fit the GPU cost model's free constants to five published MLPerf Training ResNet-50 results, and print the fit.

The in-sample systems are NVIDIA's MXNet runs on DGX A100 (v2.1: 1 and 8 nodes) and DGX H100 (v3.0: 1, 8 and 64
nodes); their result logs (mlcommons/training_results_v2.1 and v3.0, NVIDIA/results/<system>/resnet/result_0..4.txt)
time every epoch and evaluation. Fitted, by least squares on the relative error of the five steady epochs (the
step is linear in each while the GPUs, not the hosts, bind):
  compute_efficiency  <- the one-node runs' large batches on two chips: one chip's FLOPs and bandwidth against the
  traffic_fraction    <- other's (H100 has 3.2x the A100's tensor peak and 1.6x its bandwidth)
  step_floor_s        <- the multi-node runs' small per-GPU batches (40 to 51 images)
  eval_image_factor   <- the five systems' evaluations (least squares on their relative errors): the images
  eval_overhead_s     <- per GPU, padded to whole batches, run from 6,528 (one node) down to 120 (64 nodes)
  warmup_epochs       <- the five times to train beyond their steps, evaluations and start (mean residual, in
                         epochs); its range is the logs' spread of the first two epochs' excess
A steady epoch is the median epoch from the third on, median over the five runs. The start and the first
evaluation's extra time are read off the same logs (ASSUMPTIONS below). Every other ResNet-50 result in
training_results v2.1 to v4.0 is held out: no constant or range is taken from one.

How far the model lands from a system it was not fitted to is measured by leaving each in-sample system out in turn:
the same fits on the other four (every assumption corner refitted on them, the warm-up's centre too) project it at
its published layout and schedule. Each fit on four is determined: the step's three constants from four steps on
two chips (the worst, without the one-node H100, still well conditioned), the evaluation's two from four
evaluations. The five errors give `evidence()`: the half-widths, Student's t at COVERAGE, that widen every GPU
projection's ranges; each system's own leave-one-out range is widened by the other four's errors alone.

    python -m projection.gpu.calibrate     # the fit, the in-sample systems against their published figures, and
                                           # each projected by a fit on the other four
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, cached_property, partial

import numpy as np

from configs.device.cluster import ClusterConfig
from hardware.gpu import Cluster
from models import batchnorm, build_resnet50
from projection.calibration import Compared, compared, constants_table, device_section, error, print_table_end
from projection.gpu import cost
from projection.gpu.cost import Constants, Layout, Projection
from projection.probe import profile_model
from projection.profile import ModelProfile
from projection.run import Schedule
from projection.uncertainty import (
    COVERAGE,
    Assumption,
    Evidence,
    Interval,
    Refit,
    interval,
    prediction_half_width,
    widened,
)


@dataclass(frozen=True)
class Published:
    """One in-sample result (the NVIDIA config behind it, its five logs) and what its logs time (medians)."""

    system: str  # the results folder
    device: str  # configs/device/<device>.yaml
    layout: Layout
    schedule: Schedule  # NUMEPOCHS reached, EVAL_OFFSET + 1, EVAL_PERIOD
    throughput_img_s: float  # a steady block of epochs and its evaluation
    time_to_train_min: float  # the olympic mean
    steady_epoch_s: float  # logs: an epoch from the third on
    evaluation_s: float  # logs: an evaluation after the first


A100 = Published(
    "dgxa100_ngc22.04_mxnet", "dgx_a100", Layout(1, 8, 408), Schedule(35, first_eval=3), 27_003, 28.685, 47.117, 1.2395
)
A100_N8 = Published(
    "dgxa100_n8_ngc22.04_mxnet", "dgx_a100", Layout(8, 8, 51), Schedule(35, first_eval=3), 166_868, 4.503, 7.641, 0.1305
)
H100 = Published(
    "dgxh100_ngc23.04_mxnet", "dgx_h100", Layout(1, 8, 400), Schedule(35, first_eval=3), 55_802, 13.601, 22.847, 0.3965
)
H100_N8 = Published(
    "dgxh100_n8_ngc23.04_mxnet", "dgx_h100", Layout(8, 8, 50), Schedule(35, first_eval=3), 293_450, 2.664, 4.346, 0.067
)
H100_N64 = Published(
    "dgxh100_n64_ngc23.04_mxnet", "dgx_h100", Layout(64, 8, 40), Schedule(50, first_eval=2),
    2_226_665, 0.509, 0.570, 0.013,
)  # fmt: skip
IN_SAMPLE = (A100, A100_N8, H100, H100_N8, H100_N64)
Systems = tuple[Published, ...]
FITTED = {  # each fitted constant and the systems that constrain it
    "compute_efficiency": "dgxa100, dgxh100 (one node each)",
    "traffic_fraction": "dgxa100, dgxh100 (one node each)",
    "step_floor_s": "dgxa100_n8, dgxh100_n8, dgxh100_n64",
    "eval_image_factor": "all five",
    "eval_overhead_s": "all five",
}

# Where the in-sample logs time a cost, its range is their spread (medians over each system's five runs); elsewhere
# no published figure pins it, and the range is what the hardware's structure allows. docs/gpu_projection.md says more.
ASSUMPTIONS: dict[str, Assumption] = {
    "floor_clock_exponent": Assumption(
        0.0, 1.0, "", "the floor in seconds whatever the clock (launches, syncs) to all in GPU cycles (boost clocks)"
    ),
    "nvlink_efficiency": Assumption(
        0.6, 0.95, "%", "NCCL's bus bandwidth within a node: a ring's protocol overheads to near line rate"
    ),
    "pcie_efficiency": Assumption(
        0.35,
        0.8,
        "%",
        "NCCL's bus bandwidth between GPUs over PCIe only (no in-sample system has it): staged through host memory"
        " (NCCL's default between GPUs on the CPU's root ports) to peer-to-peer below a PCIe switch, less headers",
    ),
    "nvlink_latency_s": Assumption(1e-6, 10e-6, "us", "one NCCL ring step over NVSwitch (or PCIe), kernel to kernel"),
    "fabric_efficiency": Assumption(
        0.5, 0.95, "%", "NCCL's bus bandwidth per InfiniBand rail: GPUDirect RDMA less headers, to near line rate"
    ),
    "fabric_latency_s": Assumption(3e-6, 20e-6, "us", "one step between nodes: a switch hop or two and NCCL's proxy"),
    "step_jitter_s": Assumption(
        0.0,
        50e-6,
        "us",
        "a GPU's mean delay a step from host noise (interrupts, daemons, the framework's threads), 0 to 0.5 % of a"
        " 10 ms step; a step waits for the slowest of N GPUs, (ln N - 0.42) times it; the in-sample steps barely"
        " separate it from the floor",
    ),
    "loader_img_s_per_core": Assumption(
        600, 3000, "", "a host core's share of decoding with nvJPEG and the hardware decoders; DGX H100 fed 498"
    ),
    "start_s": Assumption(0.22, 1.14, "s", "logs: run_start to the first epoch (A100 0.22, H100 0.8, n8 1.14)", True),
    "warmup_epochs": Assumption(
        0.115,
        1.293,
        "",
        "centre fitted to the five times to train; logs: the first two epochs over two steady ones, 0.12 to 1.29",
        True,
    ),
    "first_eval_extra_s": Assumption(
        0.032, 5.53, "s", "logs: the first evaluation over a later one (H100 n64 0.03 to one DGX A100 5.5)", True
    ),
}


@cache
def resnet50_profile() -> ModelProfile:
    """ResNet-50 v1.5, one training image probed on the host (a few seconds): its FLOPs, traffic and parameters."""
    model = build_resnet50(1000, batchnorm(0.1, 1e-5), channels_last=True)
    return profile_model(model, micro_batch=1, image_size=224)


def load_cluster(name: str) -> Cluster:
    """configs/device/<name>.yaml's cluster with its GPU."""
    return device_section(name, ClusterConfig).chosen_cluster


def in_sample_clusters() -> dict[str, Cluster]:
    """Each in-sample device's cluster, composed once."""
    return {device: load_cluster(device) for device in dict.fromkeys(p.device for p in IN_SAMPLE)}


def target_s(published: Published) -> float:
    """One step of the published run: its steady epoch over its steps."""
    return published.steady_epoch_s * published.layout.global_batch / published.schedule.train_images


def fit_step(
    profile: ModelProfile, clusters: Mapping[str, Cluster], assumed: Constants, systems: Systems = IN_SAMPLE
) -> Constants | None:
    """compute_efficiency, traffic_fraction and step_floor_s by least squares on the steps' relative errors; None
    where the assumed constants leave no physical fit (an efficiency or fraction outside (0, 1], a negative floor,
    a run its hosts would bind)."""
    flops, traffic = cost.image_work(profile)
    no_floor, unit_floor = (dataclasses.replace(assumed, step_floor_s=floor) for floor in (0.0, 1.0))
    rows, targets = [], []
    for published in systems:
        cluster, layout = clusters[published.device], published.layout
        step, _ = cost.step_time(profile, cluster, layout, no_floor)
        rest = step.device_s - step.compute_s
        target = target_s(published)
        gpu = cluster.gpu
        floor = cost.floor_s(cluster, unit_floor)
        row = [layout.batch * flops / gpu.fp16_flops, layout.batch * traffic / gpu.memory_bandwidth, floor]
        rows.append([value / target for value in row])
        targets.append((target - rest) / target)
    (inverse_efficiency, fraction, floor), *_ = np.linalg.lstsq(np.array(rows), np.array(targets), rcond=None)
    if inverse_efficiency < 1 or not 0 < fraction <= 1 or floor < 0:
        return None
    fitted = dataclasses.replace(
        assumed,
        compute_efficiency=float(1 / inverse_efficiency),
        traffic_fraction=float(fraction),
        step_floor_s=float(floor),
    )
    return fitted if device_bound(profile, clusters, fitted, systems) else None


def device_bound(
    profile: ModelProfile, clusters: Mapping[str, Cluster], constants: Constants, systems: Systems = IN_SAMPLE
) -> bool:
    """Whether every one of the systems' runs is bound by its GPUs, not by its hosts' decoding."""
    steps = (cost.step_time(profile, clusters[p.device], p.layout, constants)[0] for p in systems)
    return all(step.device_s >= step.host_feed_s for step in steps)


def fit_evaluation(
    profile: ModelProfile, clusters: Mapping[str, Cluster], constants: Constants, systems: Systems = IN_SAMPLE
) -> Constants | None:
    """eval_image_factor and eval_overhead_s by least squares on the evaluations' relative errors, beyond their
    reductions over every GPU; None where either would be negative."""
    rows, targets = [], []
    for published in systems:
        cluster, layout, evaluation = clusters[published.device], published.layout, published.evaluation_s
        images = cost.eval_images_per_gpu(layout, published.schedule)
        forward = cost.image_s(profile, cluster, constants, forward_only=True)
        rows.append([images * forward / evaluation, 1 / evaluation])
        targets.append(1 - 2 * cost.reduction_s(cluster, layout, constants) / evaluation)
    (factor, overhead), *_ = np.linalg.lstsq(np.array(rows), np.array(targets), rcond=None)
    if factor <= 0 or overhead < 0:
        return None
    return dataclasses.replace(constants, eval_image_factor=float(factor), eval_overhead_s=float(overhead))


def fit(
    profile: ModelProfile, clusters: Mapping[str, Cluster], assumed: Constants, systems: Systems = IN_SAMPLE
) -> Constants | None:
    """`assumed` with the constants fitted to `systems`; None where no physical fit exists."""
    fitted = fit_step(profile, clusters, assumed, systems)
    return None if fitted is None else fit_evaluation(profile, clusters, fitted, systems)


def refitter(profile: ModelProfile, clusters: Mapping[str, Cluster], systems: Systems = IN_SAMPLE) -> Refit[Constants]:
    """`fit` to `systems` for any assumed constants, each set fitted once."""
    return cache(partial(fit, profile, clusters, systems=systems))


def fit_warmup(
    profile: ModelProfile, clusters: Mapping[str, Cluster], constants: Constants, systems: Systems = IN_SAMPLE
) -> float:
    """The mean, over `systems`, of the time to train their steps, evaluations and start leave, in epochs: the
    warm-up of the first epochs and whatever else the timed run holds."""
    cold = dataclasses.replace(constants, warmup_epochs=0.0)
    residuals = []
    for published in systems:
        projection = project_published(profile, clusters[published.device], published, cold)
        left_s = 60 * (published.time_to_train_min - projection.time_to_train_min)
        residuals.append(left_s / projection.epoch_s)
    return sum(residuals) / len(residuals)


def central_fit(
    profile: ModelProfile, clusters: Mapping[str, Cluster], systems: Systems = IN_SAMPLE
) -> tuple[Constants, Refit[Constants]]:
    """The constants fitted to `systems` at the assumptions' central values (the warm-up's centre fitted last, to
    the time to train), and the refit every range repeats (which keeps each corner's warm-up)."""
    refit = refitter(profile, clusters, systems)
    fitted = refit(Constants())
    assert fitted is not None, "the central constants must fit the in-sample results"
    return dataclasses.replace(fitted, warmup_epochs=fit_warmup(profile, clusters, fitted, systems)), refit


@dataclass(frozen=True)
class Calibration:
    profile: ModelProfile
    clusters: Mapping[str, Cluster]  # the in-sample systems' clusters by device name
    central: Constants
    refit: Refit[Constants]


@cache
def calibrated() -> Calibration:
    """The fit on the in-sample systems, once per process: every projection's ranges refit the same corners."""
    profile, clusters = resnet50_profile(), in_sample_clusters()
    central, refit = central_fit(profile, clusters)
    return Calibration(profile, clusters, central, refit)


def project_published(
    profile: ModelProfile, cluster: Cluster, published: Published, constants: Constants
) -> Projection:
    return cost.project(profile, cluster, published.layout, constants, published.schedule)


def others(left_out: Published) -> Systems:
    """The in-sample systems but `left_out`."""
    return tuple(published for published in IN_SAMPLE if published != left_out)


@dataclass(frozen=True)
class LeftOut:
    """An in-sample system projected by the constants fitted to the other four (the same fits, the warm-up's centre
    among them): what the model says of a system it was not fitted to. Its range over the assumptions, each corner
    refitted on the four, is built only where it is shown (every projection's evidence needs the errors alone)."""

    published: Published
    at: Callable[[Constants], Projection]  # the system's layout and schedule, projected under given constants
    central: Constants
    refit: Refit[Constants]

    @cached_property
    def projection(self) -> Projection:
        return self.at(self.central)

    @cached_property
    def spread(self) -> Interval[Projection]:
        return interval(self.at, self.refit, self.central, ASSUMPTIONS)

    @property
    def throughput_error_pct(self) -> float:
        return error(self.projection.throughput_img_s, self.published.throughput_img_s)

    @property
    def time_to_train_error_pct(self) -> float:
        return error(self.projection.time_to_train_min, self.published.time_to_train_min)


def leave_out(fit: Calibration, published: Published) -> LeftOut:
    """`published` (its layout and schedule) projected from a fit on the other four. Each fit on four is determined:
    the step's three constants from four steps on two chips, the evaluation's two from four evaluations."""
    central, refit = central_fit(fit.profile, fit.clusters, others(published))
    at = partial(project_published, fit.profile, fit.clusters[published.device], published)
    return LeftOut(published, at, central, refit)


@cache
def leave_one_out() -> tuple[LeftOut, ...]:
    """Each in-sample system left out in turn, once per process."""
    fit = calibrated()
    return tuple(leave_out(fit, published) for published in IN_SAMPLE)


def evidence_from(results: Sequence[LeftOut], source: str) -> Evidence:
    """The half-widths that hold COVERAGE of one more system's errors, from these leave-one-out errors."""
    return Evidence(
        prediction_half_width([result.throughput_error_pct for result in results]),
        prediction_half_width([result.time_to_train_error_pct for result in results]),
        source,
    )


EVIDENCE_SOURCE = "leave-one-out over the five in-sample systems"


@cache
def evidence() -> Evidence:
    """How far the GPU model lands from systems it was not fitted to: the half-widths from all five leave-one-out
    errors (time to train at each system's published epochs), to widen every GPU projection's ranges by."""
    return evidence_from(leave_one_out(), EVIDENCE_SOURCE)


def left_out_range(result: LeftOut, results: Sequence[LeftOut]) -> Interval[Projection]:
    """A left-out system's range: its assumptions' range widened by the half-widths of the other systems'
    leave-one-out errors, so that its own error never sizes its own range."""
    rest = [other for other in results if other is not result]
    source = f"leave-one-out over the in-sample systems but {result.published.system}"
    return widened(result.spread, evidence_from(rest, source))


def print_constants(central: Constants, refit: Refit[Constants]) -> None:
    fitted_on = "DGX A100 (1, 8 nodes; MLPerf Training v2.1) and DGX H100 (1, 8, 64 nodes; v3.0), ResNet-50"
    print(constants_table(central, refit, ASSUMPTIONS, FITTED, fitted_on))


def in_sample_interval(
    profile: ModelProfile,
    clusters: Mapping[str, Cluster],
    published: Published,
    central: Constants,
    refit: Refit[Constants],
) -> Interval[Projection]:
    at = partial(project_published, profile, clusters[published.device], published)
    return interval(at, refit, central, ASSUMPTIONS)


def print_header(with_inside: bool = False) -> None:
    inside = " in" if with_inside else ""
    throughput = f"{'img/s':>10} {'range':>21} {'published':>10} {'error':>7}{inside}"
    time_to_train = f"{'TTT min':>8} {'range':>13} {'published':>10} {'error':>7}{inside}"
    print(f"{'system':<27} {'N x G x b':>10} {throughput} {time_to_train}")


def holds(spread: Interval[Projection], published: Published) -> tuple[bool, bool]:
    """Whether the published throughput, and time to train, lie in the range."""
    (low, high), (fastest, slowest) = spread.throughput_img_s, spread.time_to_train_min
    return low <= published.throughput_img_s <= high, fastest <= published.time_to_train_min <= slowest


def table_row(published: Published, projection: Projection, row: Compared, held: tuple[bool, bool] | None) -> str:
    """A system's line in a calibration table: its throughput and time to train, each with its range, the published
    figure and the error, and (the leave-one-out table) whether the published figure lies in the range."""
    layout = published.layout
    inside = ("", "") if held is None else tuple(" yes" if each else "  no" for each in held)
    return (
        f"{published.system:<27} {f'{layout.nodes}x{layout.gpus_per_node}x{layout.batch}':>10}"
        f" {projection.throughput_img_s:>10,.0f} {row.rates:>21}"
        f" {published.throughput_img_s:>10,.0f} {row.throughput_error_pct:>+6.1f}%{inside[0]}"
        f" {projection.time_to_train_min:>8.3f} {row.minutes:>13}"
        f" {published.time_to_train_min:>10.3f} {row.time_to_train_error_pct:>+6.1f}%{inside[1]}"
    )


def print_in_sample(fit: Calibration) -> tuple[list[Compared], dict[str, object]]:
    """Each in-sample system's projection with its range beside its published figures; the rows and the JSON."""
    print_header()
    summary: dict[str, object] = {name: getattr(fit.central, name) for name in FITTED}
    rows = []
    for published in IN_SAMPLE:
        spread = in_sample_interval(fit.profile, fit.clusters, published, fit.central, fit.refit)
        row = compared(spread, published.throughput_img_s, published.time_to_train_min)
        print(table_row(published, spread.central, row, None))
        rows.append(row)
        summary[published.system] = row.summary
    return rows, summary


def half_widths(spread: Interval[Projection]) -> tuple[float, float]:
    """Half the throughput's range, and the time to train's, over its central value."""
    (low, high), (fastest, slowest) = spread.throughput_img_s, spread.time_to_train_min
    central = spread.central
    return (high - low) / 2 / central.throughput_img_s, (slowest - fastest) / 2 / central.time_to_train_min


def median_half_widths(spreads: Sequence[Interval[Projection]]) -> dict[str, float]:
    throughput, time_to_train = zip(*map(half_widths, spreads), strict=True)
    return {"throughput": statistics.median(throughput), "time_to_train": statistics.median(time_to_train)}


def percent(fraction: float) -> str:
    return f"{100 * fraction:.1f} %"


def print_leave_one_out(results: Sequence[LeftOut]) -> dict[str, object]:
    """Each system projected by the fit on the other four, in the range the other four's errors size; then the
    half-widths from all five, and the median width of those ranges. Returns its JSON."""
    coverage = f"{COVERAGE * 100:.0f} %"
    print(
        "\nleave-one-out: each system projected by the constants fitted to the other four; its range the assumptions'"
        f" (each corner refitted on the four), widened to hold {coverage} by the other four's leave-one-out errors"
    )
    print_header(with_inside=True)
    summary: dict[str, object] = {}
    spreads = [left_out_range(result, results) for result in results]
    for result, spread in zip(results, spreads, strict=True):
        published = result.published
        row, held = compared(spread, published.throughput_img_s, published.time_to_train_min), holds(spread, published)
        print(table_row(published, spread.central, row, held))
        summary[published.system] = row.summary | {"inside": list(held)}
    found, medians = evidence_from(results, EVIDENCE_SOURCE), median_half_widths(spreads)
    print(
        f"half-widths holding {coverage} of a new system's error (Student's t over the {len(results)} leave-one-out"
        f" errors, as many degrees of freedom): throughput {percent(found.throughput)}, time to train"
        f" {percent(found.time_to_train)}"
    )
    print(
        f"median half-width of the leave-one-out ranges above: throughput {percent(medians['throughput'])},"
        f" time to train {percent(medians['time_to_train'])}"
    )
    return {
        "systems": summary,
        "half_widths": {"throughput": round(found.throughput, 4), "time_to_train": round(found.time_to_train, 4)},
        "median_range_half_widths": {name: round(width, 4) for name, width in medians.items()},
    }


def print_calibration(fit: Calibration) -> None:
    """The fit, each in-sample system's projection with its range beside its published figures, then each system
    projected by the fit on the other four; the JSON line last."""
    print_constants(fit.central, fit.refit)
    rows, summary = print_in_sample(fit)
    summary["leave_one_out"] = print_leave_one_out(leave_one_out())
    print_table_end(rows, " as the logs give it: a steady block of 4 epochs and its evaluation", summary)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    print_calibration(calibrated())


if __name__ == "__main__":
    main()
