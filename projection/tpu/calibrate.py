"""Fit the TPU cost model's free constants to six of Google's published MLPerf Training ResNet-50 results.

The in-sample systems are Google's TensorFlow runs on TPU v3 (v0.6: tpu-v3-32, tpu-v3-512; v0.7: tpu-v3-8192-TF)
and TPU v4 (v0.7: tpu-v4-16-TF, tpu-v4-128-TF; v1.0: tpu-v4-4096-TF); their result logs (mlcommons/
training_results_v0.6, v0.7 and v1.0, Google/results/<system>/resnet/result_0..4.txt) time each 4-epoch block with
its evaluation and the whole run. Fitted:
  mxu_efficiency, traffic_fraction <- the per-chip rates at 256, 128 and 16 images a chip on two chips (least
  optimizer_tensor_s, hop_latency_s  squares on the six throughputs' relative errors: every term is linear in
                                     these four); the per-tensor optimizer from the runs that update every tensor
                                     on every replica against v1.0's sharded one; the hop's latency also from the
                                     v0.6 runs, whose time grows with the torus's ring steps as 161 separate
                                     gradient reductions would
  decode_img_s_per_host            <- the five times to train within one pod beyond their blocks, start and host
                                     calls: the first epoch's decoding on each host before it caches the images
  multipod_start_s                 <- what tpu-v3-8192-TF's time to train leaves: the start of a slice that joins
                                     four pods (the only such system)
The throughput of a system is MLPerf's, as the logs give it: a steady block of 4 epochs and its evaluation (the
median over blocks and runs). Every other TPU ResNet-50 result in training_results v0.6 to v2.0 is held out: no
constant or range is taken from one.

Leave-one-out: each in-sample system projected by the same fits on the other five, every assumption corner refitted
on them. The six errors give the evidence, the half-widths (Student's t at COVERAGE) that widen every TPU
projection's ranges; each system's own range is widened by the other five's errors alone.

    python -m projection.tpu.calibrate     # the fit, the in-sample systems against their published figures, and
                                           # each projected by a fit on the other five
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Sequence
from functools import cached_property

import numpy as np
from scipy.optimize import minimize_scalar

from projection import calibration
from projection.calibration import Columns, device_section
from projection.probe import resnet50_profile
from projection.profile import ModelProfile
from projection.run import Schedule
from projection.tpu import cost
from projection.tpu.config import TpuChip, TpuSliceConfig
from projection.tpu.cost import Constants, Layout, Projection
from projection.uncertainty import COVERAGE, Assumption, Interval

Published = calibration.Published[Layout]

PER_TENSOR = 161  # ResNet-50's gradient tensors, reduced one by one (the v0.6 runs' behaviour)


def v3(chips: int, per_core: int, bn_group: int, reductions: int = 1) -> Layout:
    """A TPU v3 slice's layout: a replica per TensorCore, two a chip, 4 chips a host, pods of 1,024 chips."""
    side = {16: (4, 4), 256: (16, 16), 4096: (64, 64)}[chips]
    pods = -(-chips // 1024)
    return Layout(chips, 2 * chips, per_core, bn_group, side, chips // 4, 1, None, reductions, False, pods)


def v4(chips: int, per_chip: int, bn_group: int, sharded: bool = False) -> Layout:
    """A TPU v4 slice's layout: a replica per chip (its megacore), 4 chips a host."""
    side = {8: (2, 2, 2), 64: (4, 4, 4), 2048: (8, 16, 16)}[chips]
    return Layout(chips, chips, per_chip, bn_group, side, chips // 4, 2, optimizer_sharded=sharded)


# BatchNorm groups from the logs' spans: 64 images over 8-image v3 cores is 8, over 16-image v4 chips 4
V3_32 = Published("tpu-v3-32", "tpu_v3", v3(16, 128, 1, PER_TENSOR), Schedule(60), 31_225, 42.186)
V3_512 = Published("tpu-v3-512", "tpu_v3", v3(256, 64, 1, PER_TENSOR), Schedule(72), 413_296, 3.853)
V3_8192 = Published("tpu-v3-8192-TF", "tpu_v3", v3(4096, 8, 8), Schedule(88), 4_682_201, 0.481)
V4_16 = Published("tpu-v4-16-TF", "tpu_v4", v4(8, 256, 1), Schedule(38, first_eval=2), 27_824, 30.769)
V4_128 = Published("tpu-v4-128-TF", "tpu_v4", v4(64, 128, 1), Schedule(42, first_eval=2), 209_649, 4.496)
V4_4096 = Published("tpu-v4-4096-TF", "tpu_v4", v4(2048, 16, 4, sharded=True), Schedule(60), 4_811_895, 0.285)
IN_SAMPLE = (V3_32, V3_512, V3_8192, V4_16, V4_128, V4_4096)
FITTED = {  # each fitted constant and the systems that constrain it
    "mxu_efficiency": "all six: 256 and 128 images a chip on v3 and v4",
    "traffic_fraction": "all six: v3 against v4 (2.24x the FLOPS, 1.33x the bandwidth)",
    "optimizer_tensor_s": "the v0.6 and v0.7 runs, which update every tensor on every replica, against v1.0's",
    "hop_latency_s": "tpu-v3-32 against tpu-v3-512 (their gradients reduced tensor by tensor), the large slices",
    "decode_img_s_per_host": "the five times to train within one pod: most, the 8- and 16-chip slices",
    "multipod_start_s": "tpu-v3-8192-TF, the only slice across pods (four v3 pods)",
}

ASSUMPTIONS: dict[str, Assumption] = {
    "ici_efficiency": Assumption(
        0.6, 0.95, "%", "an all-reduce's bandwidth over the ICI links' line rate: protocol overheads to near line rate"
    ),
    "eval_image_factor": Assumption(
        0.8, 1.5, "", "an evaluated image over a training forward pass: a fused inference graph to a padded, slower one"
    ),
    "cached_img_s_per_host": Assumption(
        20_000,
        80_000,
        "",
        "a host feeding its cached decoded images (crop, flip, transfer); the in-sample hosts fed up to 13,900",
    ),
    "call_s": Assumption(1e-3, 50e-3, "ms", "one host call of the device's loop: its launch and infeed set-up"),
    "start_s": Assumption(0.3, 3.0, "s", "run_start to the first step: the input pipelines' first batches", True),
}

# A chip no ResNet-50 result calibrates: its MXU and memory times scaled over this range. v4's per-chip rate over
# v3's fell 8 to 21 % short of its peak-FLOPS ratio (1.78x and 2.06x against 2.24x); a new generation may land as far
# from the fit either way.
UNCALIBRATED = Assumption(
    0.79,
    1.27,
    "",
    "the MXU and memory times of a chip no published ResNet-50 result calibrates: v4 per chip fell 8 to 21 % short"
    " of its peak-FLOPS ratio over v3, so a new chip may land as far from the fit either way",
)


def load_chip(name: str) -> TpuChip:
    """configs/device/<name>.yaml's chip."""
    return device_section(name, TpuSliceConfig).chosen_chip


def block_s(published: Published, throughput_img_s: float) -> float:
    """A steady block of `eval_every` epochs and its evaluation, from its throughput."""
    return published.schedule.eval_every * published.schedule.train_images / throughput_img_s


class TpuCalibration(calibration.Calibration[Constants, Projection, Layout]):
    """The TPU cost model's calibration on Google's six in-sample results: least squares on the blocks' times, then
    the first epoch's decoding to the times to train."""

    in_sample = IN_SAMPLE
    fitted = FITTED
    assumptions = ASSUMPTIONS
    fitted_on = (
        "TPU v3 (16, 256 chips: MLPerf Training v0.6; 4,096: v0.7) and TPU v4 (8, 64 chips: v0.7; 2,048: v1.0),"
        " ResNet-50"
    )
    evidence_source = "leave-one-out over the six in-sample systems"
    columns = Columns(rate=10, rates=21, minutes=13, missed="  no")
    left_out_title = (
        "leave-one-out: each system projected by the constants fitted to the other five; its range the assumptions'"
        f" (each corner refitted on the five), widened to hold {COVERAGE * 100:.0f} % by the other five's"
        " leave-one-out errors"
    )
    what_throughput_is = " as the logs give it: a steady block of 4 epochs and its evaluation"

    @cached_property
    def profile(self) -> ModelProfile:
        return resnet50_profile()

    @cached_property
    def chips(self) -> dict[str, TpuChip]:
        """Each in-sample device's chip, composed once."""
        return {device: load_chip(device) for device in dict.fromkeys(p.device for p in IN_SAMPLE)}

    def assumed(self) -> Constants:
        return Constants()

    def project_published(self, published: Published, constants: Constants) -> Projection:
        chip = self.chips[published.device]
        return cost.project(self.profile, chip, published.layout, constants, published.schedule)

    def fit(self, assumed: Constants, systems: Sequence[Published]) -> Constants | None:
        stepped = self.fit_steps(assumed, systems)
        return None if stepped is None else self.fit_decoding(stepped, systems)

    def block_at(self, published: Published, constants: Constants) -> float:
        return block_s(published, self.project_published(published, constants).throughput_img_s)

    def fit_steps(self, assumed: Constants, systems: Sequence[Published]) -> Constants | None:
        """The four step constants by least squares on the blocks' relative errors. A block's time is linear in
        1 / mxu_efficiency, traffic_fraction, optimizer_tensor_s and hop_latency_s, so each column is the block at
        one of them set to 1 (the others 0) less the block at all 0, the hosts' feed left out (the steps are the
        device's where it does not bind, which the fit checks). None where the assumed constants leave no physical
        fit (an efficiency above 1, a negative term, a run its hosts bind)."""
        names = ("mxu_efficiency", "traffic_fraction", "optimizer_tensor_s", "hop_latency_s")
        zero = dataclasses.replace(assumed, **dict(zip(names, (float("inf"), 0.0, 0.0, 0.0), strict=True)))
        zero = dataclasses.replace(zero, cached_img_s_per_host=float("inf"))  # the device's steps alone: linear
        units = [dataclasses.replace(zero, **{name: 1.0}) for name in names]
        rows, targets = [], []
        for published in systems:
            target = block_s(published, published.throughput_img_s)
            base = self.block_at(published, zero)
            rows.append([(self.block_at(published, unit) - base) / target for unit in units])
            targets.append(1 - base / target)
        (inverse, fraction, tensor, hop), *_ = np.linalg.lstsq(np.array(rows), np.array(targets), rcond=None)
        if inverse < 1 or not 0 < fraction <= 1 or tensor < 0 or hop < 0:
            return None
        fitted = dataclasses.replace(
            assumed,
            mxu_efficiency=float(1 / inverse),
            traffic_fraction=float(fraction),
            optimizer_tensor_s=float(tensor),
            hop_latency_s=float(hop),
        )
        return fitted if self.device_bound(fitted, systems) else None

    def device_bound(self, constants: Constants, systems: Sequence[Published]) -> bool:
        """Whether every one of the systems' steady steps is bound by its chips, not by its hosts' feed."""
        steps = (self.project_published(p, constants).step for p in systems)
        return all(step.device_s >= step.host_feed_s for step in steps)

    def fit_decoding(self, constants: Constants, systems: Sequence[Published]) -> Constants:
        """decode_img_s_per_host by least squares on the times to train's relative errors of the slices within one
        pod (a bounded search between 500 and 100,000 images a second a host), then multipod_start_s as the mean of
        what the slices across pods leave (0 where none is among `systems`: nothing says otherwise)."""
        within = [p for p in systems if p.layout.pods == 1]

        def squared_errors(log_rate: float) -> float:
            tried = dataclasses.replace(constants, decode_img_s_per_host=float(np.exp(log_rate)))
            errors = [self.project_published(p, tried).time_to_train_min / p.time_to_train_min - 1 for p in within]
            return sum(error**2 for error in errors)

        found = minimize_scalar(squared_errors, bounds=(np.log(500), np.log(100_000)), method="bounded")
        decoded = dataclasses.replace(constants, decode_img_s_per_host=float(np.exp(found.x)), multipod_start_s=0.0)
        across = [p for p in systems if p.layout.pods > 1]
        left = [60 * (p.time_to_train_min - self.project_published(p, decoded).time_to_train_min) for p in across]
        return dataclasses.replace(decoded, multipod_start_s=max(0.0, statistics.fmean(left)) if left else 0.0)

    def lead(self, published: Published | None, left_out: bool) -> str:
        if published is None:
            return f"{'system':<16} {'chips x b':>10}"
        layout = published.layout
        per_chip = layout.replica_batch * layout.replicas_per_chip
        return f"{published.system:<16} {f'{layout.chips}x{per_chip}':>10}"

    def left_out_summary(
        self, systems: dict[str, object], spreads: Sequence[Interval[Projection]]
    ) -> dict[str, object]:
        """The half-widths from all six errors, and the median width of the left-out ranges."""
        return calibration.half_width_summary(self, systems, spreads)


CALIBRATION = TpuCalibration()  # the fit on the in-sample systems, once per process


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    calibration.print_calibration(CALIBRATION)


if __name__ == "__main__":
    main()
