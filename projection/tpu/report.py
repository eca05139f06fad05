"""run.mode=project's answer for a TPU slice: the projected time to train and throughput with the ranges the assumed
constants allow (each corner refitted to the in-sample results, as the central value is), widened by the model's
leave-one-out error and, for a chip no published result calibrates, by what that costs; the step by component; how
far the run reaches beyond the calibrated systems; and one JSON line with the other families' keys."""

from __future__ import annotations

import dataclasses
import json

from projection import convergence, uncertainty
from projection.convergence import Epochs
from projection.profile import ModelProfile
from projection.report import step_table
from projection.run import Schedule
from projection.tpu import calibrate, cost
from projection.tpu.config import TpuChip
from projection.tpu.cost import Constants, Layout, Projection
from projection.uncertainty import Interval


def calibrated_chips() -> set[str]:
    """The generations a published ResNet-50 result calibrates (v3, v4)."""
    return {chip.name for chip in calibrate.CALIBRATION.chips.values()}


def text(chip: TpuChip, layout: Layout, schedule: Schedule, epochs: Epochs) -> str:
    """The whole report for `layout` on a slice of `chip`; its last line is the JSON."""
    fit = calibrate.CALIBRATION
    assumptions = dict(fit.assumptions)
    if not layout.calibrated:
        assumptions["uncalibrated_scale"] = calibrate.UNCALIBRATED

    def at(constants: Constants, run: Schedule = schedule) -> Projection:
        return cost.project(fit.profile, chip, layout, constants, run)

    def minutes(stop: int) -> float:
        """The time to train of a run that stops at epoch `stop`."""
        return at(fit.central, dataclasses.replace(schedule, epochs=stop)).time_to_train_min

    ranged = uncertainty.interval(at, fit.refit, fit.central, assumptions)
    spread = uncertainty.widened(convergence.scored(ranged, epochs.stops, minutes, epochs.fixed), fit.evidence)
    beyond = beyond_calibration(chip, layout, spread.central)
    return "\n".join(
        [
            uncertainty.headline(spread, epochs.said()) + "\n",
            slice_line(chip, layout),
            f"epochs: {epochs.source}",
            f"compute: {compute_source(chip, layout)}",
            "",
            breakdown(fit.profile, chip, spread.central, layout, epochs),
            uncertainty.report(spread, fit.central, assumptions),
            uncertainty.reach(beyond),
            json.dumps(figures(spread, layout) | {"beyond_calibration": beyond}),
        ]
    )


def slice_line(chip: TpuChip, layout: Layout) -> str:
    """The slice in Google's name and in chips, its torus, hosts and replicas, and the batch each replica takes."""
    cores = layout.chips * chip.tensorcores
    counted = "TensorCores" if chip.names_count == "tensorcores" else "chips"
    replica = "a chip (its megacore)" if layout.cores_per_replica > 1 else "a TensorCore"
    group = f", BatchNorm summed over {layout.bn_group} replicas" if layout.bn_group > 1 else ""
    return (
        f"{chip.google_name(layout.chips)} (Google's name counts {counted}): {layout.chips:,} TPU {chip.name} chips,"
        f" {cores:,} TensorCores, a {'x'.join(map(str, layout.torus))} torus, {layout.hosts:,} hosts;"
        f" {layout.replicas:,} replicas of {replica}, {layout.replica_batch} images each of the global batch"
        f" {layout.global_batch:,}{group}"
    )


def compute_source(chip: TpuChip, layout: Layout) -> str:
    if layout.calibrated:
        return "modelled from the chip's datasheet at the efficiencies fitted to Google's MLPerf runs on TPU v3 and v4"
    low, high = calibrate.UNCALIBRATED.low, calibrate.UNCALIBRATED.high
    return (
        f"no published ResNet-50 result calibrates TPU {chip.name}: its datasheet through the v3 and v4 fit, its MXU"
        f" and memory times taken {low:g} to {high:g} times the fit's in the ranges below"
    )


def breakdown(profile: ModelProfile, chip: TpuChip, projection: Projection, layout: Layout, epochs: Epochs) -> str:
    """The step by component, then what the run holds besides its steps, at `epochs.count`."""
    step = projection.step
    fill = cost.mxu_fill(profile, chip, layout.replica_batch)
    terms = {
        f"MXU ({layout.replica_batch} images a replica, rows {100 * fill:.0f} % full)": step.mxu_s,
        "memory-bound (BatchNorm, elementwise) at HBM": step.memory_s,
        f"BatchNorm sums over groups of {layout.bn_group}": step.batchnorm_s,
    }
    for dimension, (side, seconds) in enumerate(zip(layout.torus, step.allreduce_s, strict=True), 1):
        if side > 1:
            terms[f"all-reduce along dimension {dimension} ({side} chips)"] = seconds
    terms[f"optimizer (LARS{', sharded' if step.optimizer_sharded else ''})"] = step.optimizer_s
    feed = "host feed from cached images (overlapped)"
    lines = step_table(layout.global_batch, terms, step.device_s, feed, step.host_feed_s, width=48)
    bound = "TPU-bound" if step.device_s >= step.host_feed_s else "bound by the hosts' input pipelines"
    lines += [
        f"throughput {projection.throughput_img_s:,.0f} img/s ({bound}; MLPerf's: a steady block of epochs and its"
        " evaluation)",
        f"epoch {projection.epoch_s:.2f} s; evaluation on the TPUs {projection.evaluation_s:.3f} s,"
        f" {projection.evaluations} of them in {epochs.count} epochs; {projection.calls} host calls;"
        f" the first epoch's decoding {projection.first_epoch_extra_s:.1f} s beyond a steady one",
        f"time to train ({epochs.said()}) {projection.time_to_train_min:.3f} min",
    ]
    return "\n".join(lines)


def beyond_calibration(chip: TpuChip, layout: Layout, projection: Projection) -> list[str]:
    """Where the run reaches beyond the in-sample systems (v3 and v4, 8 to 4,096 chips, 8 to 256 images a
    replica); only an uncalibrated chip widens the ranges for it."""
    published = calibrate.IN_SAMPLE
    beyond = []
    if not layout.calibrated:
        beyond.append(f"TPU {chip.name}: no published ResNet-50 result (calibrated: v3, v4)")
    most = max(p.layout.chips for p in published)
    if layout.chips > most:
        beyond.append(f"{layout.chips:,} chips (calibrated: up to {most:,}): the torus's terms as modelled")
    low = min(p.layout.replica_batch for p in published)
    high = max(p.layout.replica_batch for p in published)
    if not low <= layout.replica_batch <= high:
        beyond.append(f"{layout.replica_batch} images a replica (calibrated: {low} to {high})")
    if layout.bn_group > 8:
        beyond.append(f"BatchNorm groups of {layout.bn_group} replicas (calibrated: up to 8)")
    if projection.step.host_feed_s > projection.step.device_s:
        beyond.append("the hosts' input pipelines bind (the in-sample runs were TPU-bound)")
    return beyond


def figures(spread: Interval[Projection], layout: Layout) -> dict[str, object]:
    """The other families' keys, and the per-chip rate."""
    return uncertainty.figures(spread) | {"img_s_per_chip": round(spread.central.throughput_img_s / layout.chips, 1)}
