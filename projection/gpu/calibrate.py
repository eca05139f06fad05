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
evaluations. The five errors give the evidence: the half-widths, Student's t at COVERAGE, that widen every GPU
projection's ranges; each system's own leave-one-out range is widened by the other four's errors alone.

    python -m projection.gpu.calibrate     # the fit, the in-sample systems against their published figures, and
                                           # each projected by a fit on the other four
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from functools import cached_property

import numpy as np

from projection import calibration
from projection.calibration import Columns, device_section
from projection.gpu import cost
from projection.gpu.config import Cluster, ClusterConfig
from projection.gpu.cost import Constants, Layout, Projection
from projection.probe import resnet50_profile
from projection.profile import ModelProfile
from projection.run import Schedule
from projection.uncertainty import COVERAGE, Assumption, Interval

Published = calibration.Published[Layout]


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


def load_cluster(name: str) -> Cluster:
    """configs/device/<name>.yaml's cluster with its GPU."""
    return device_section(name, ClusterConfig).chosen_cluster


def target_s(published: Published) -> float:
    """One step of the published run: its steady epoch over its steps."""
    return published.steady_epoch_s * published.layout.global_batch / published.schedule.train_images


class GpuCalibration(calibration.Calibration[Constants, Projection, Layout]):
    """The GPU cost model's calibration on NVIDIA's five in-sample results: least squares on the steps and the
    evaluations, then the warm-up's centre to the times to train."""

    in_sample = IN_SAMPLE
    fitted = FITTED
    assumptions = ASSUMPTIONS
    fitted_on = "DGX A100 (1, 8 nodes; MLPerf Training v2.1) and DGX H100 (1, 8, 64 nodes; v3.0), ResNet-50"
    evidence_source = "leave-one-out over the five in-sample systems"
    columns = Columns(rate=10, rates=21, minutes=13, missed="  no")
    left_out_title = (
        "leave-one-out: each system projected by the constants fitted to the other four; its range the assumptions'"
        f" (each corner refitted on the four), widened to hold {COVERAGE * 100:.0f} % by the other four's"
        " leave-one-out errors"
    )
    what_throughput_is = " as the logs give it: a steady block of 4 epochs and its evaluation"

    @cached_property
    def profile(self) -> ModelProfile:
        return resnet50_profile()

    @cached_property
    def clusters(self) -> dict[str, Cluster]:
        """Each in-sample device's cluster, composed once."""
        return {device: load_cluster(device) for device in dict.fromkeys(p.device for p in IN_SAMPLE)}

    def assumed(self) -> Constants:
        return Constants()

    def project_published(self, published: Published, constants: Constants) -> Projection:
        cluster = self.clusters[published.device]
        return cost.project(self.profile, cluster, published.layout, constants, published.schedule)

    def fit(self, assumed: Constants, systems: Sequence[Published]) -> Constants | None:
        fitted = self.fit_step(assumed, systems)
        return None if fitted is None else self.fit_evaluation(fitted, systems)

    def fit_step(self, assumed: Constants, systems: Sequence[Published]) -> Constants | None:
        """compute_efficiency, traffic_fraction and step_floor_s by least squares on the steps' relative errors; None
        where the assumed constants leave no physical fit (an efficiency or fraction outside (0, 1], a negative
        floor, a run its hosts would bind)."""
        flops, traffic = cost.image_work(self.profile)
        no_floor, unit_floor = (dataclasses.replace(assumed, step_floor_s=floor) for floor in (0.0, 1.0))
        rows, targets = [], []
        for published in systems:
            cluster, layout = self.clusters[published.device], published.layout
            step, _ = cost.step_time(self.profile, cluster, layout, no_floor)
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
        return fitted if self.device_bound(fitted, systems) else None

    def device_bound(self, constants: Constants, systems: Sequence[Published] = IN_SAMPLE) -> bool:
        """Whether every one of the systems' runs is bound by its GPUs, not by its hosts' decoding."""
        steps = (cost.step_time(self.profile, self.clusters[p.device], p.layout, constants)[0] for p in systems)
        return all(step.device_s >= step.host_feed_s for step in steps)

    def fit_evaluation(self, constants: Constants, systems: Sequence[Published]) -> Constants | None:
        """eval_image_factor and eval_overhead_s by least squares on the evaluations' relative errors, beyond their
        reductions over every GPU; None where either would be negative."""
        rows, targets = [], []
        for published in systems:
            cluster, layout, evaluation = self.clusters[published.device], published.layout, published.evaluation_s
            images = cost.eval_images_per_gpu(layout, published.schedule)
            forward = cost.image_s(self.profile, cluster, constants, forward_only=True)
            rows.append([images * forward / evaluation, 1 / evaluation])
            targets.append(1 - 2 * cost.reduction_s(cluster, layout, constants) / evaluation)
        (factor, overhead), *_ = np.linalg.lstsq(np.array(rows), np.array(targets), rcond=None)
        if factor <= 0 or overhead < 0:
            return None
        return dataclasses.replace(constants, eval_image_factor=float(factor), eval_overhead_s=float(overhead))

    def centred(self, central: Constants, systems: Sequence[Published]) -> Constants:
        """The warm-up's centre fitted last, to the time to train (every corner keeps its own warm-up): the mean,
        over `systems`, of the time to train their steps, evaluations and start leave, in epochs (the warm-up of
        the first epochs and whatever else the timed run holds)."""
        cold = dataclasses.replace(central, warmup_epochs=0.0)
        residuals = []
        for published in systems:
            projection = self.project_published(published, cold)
            residuals.append(60 * (published.time_to_train_min - projection.time_to_train_min) / projection.epoch_s)
        return dataclasses.replace(central, warmup_epochs=sum(residuals) / len(residuals))

    def lead(self, published: Published | None, left_out: bool) -> str:
        if published is None:
            return f"{'system':<27} {'N x G x b':>10}"
        layout = published.layout
        return f"{published.system:<27} {f'{layout.nodes}x{layout.gpus_per_node}x{layout.batch}':>10}"

    def left_out_summary(
        self, systems: dict[str, object], spreads: Sequence[Interval[Projection]]
    ) -> dict[str, object]:
        """The half-widths from all five errors, and the median width of the left-out ranges."""
        return calibration.half_width_summary(self, systems, spreads)


CALIBRATION = GpuCalibration()  # the fit on the in-sample systems, once per process


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    calibration.print_calibration(CALIBRATION)


if __name__ == "__main__":
    main()
