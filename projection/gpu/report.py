"""run.mode=project's answer for a GPU cluster: the projected time to train and throughput with the ranges the
assumed constants allow (each corner refitted to the in-sample results, as the central value is), the step time by
component, how far the run reaches beyond the calibrated systems, and one JSON line with the IPU report's keys."""

from __future__ import annotations

import dataclasses
import json

from projection import convergence, uncertainty
from projection.convergence import Epochs
from projection.gpu import calibrate
from projection.gpu.config import Cluster
from projection.gpu.cost import Constants, Layout, MeasuredStep, Projection, project
from projection.gpu.measured import Check
from projection.report import step_table
from projection.run import Schedule
from projection.uncertainty import Interval


def text(
    cluster: Cluster,
    layout: Layout,
    schedule: Schedule,
    epochs: Epochs,
    check: Check | None,
) -> str:
    """The whole report for `layout` on `cluster` (with a GPU `check`, its measured step, and what rn50perf's own
    loader fed train.py on that machine); its last line is the JSON."""
    fit = calibrate.CALIBRATION
    measured = None if check is None else check.step

    def at(constants: Constants, run: Schedule = schedule) -> Projection:
        return project(fit.profile, cluster, layout, constants, run, measured)

    def minutes(stop: int) -> float:
        """The time to train of a run that stops at epoch `stop`."""
        return at(fit.central, dataclasses.replace(schedule, epochs=stop)).time_to_train_min

    scored = convergence.scored(fit.ranges(at), epochs.stops, minutes, epochs.fixed)
    spread = uncertainty.widened(scored, fit.evidence)
    beyond = beyond_calibration(cluster, layout, spread.central, measured)
    return "\n".join(
        [
            uncertainty.headline(spread, epochs.said()) + "\n",
            system_line(cluster, layout),
            f"epochs: {epochs.source}",
            f"compute: {compute_source(measured)}",
            *input_lines(check),
            "",
            breakdown(spread.central, layout, epochs),
            uncertainty.report(spread, fit.central, calibrate.ASSUMPTIONS),
            uncertainty.reach(beyond),
            json.dumps(figures(spread, layout) | {"beyond_calibration": beyond} | fed_figures(check)),
        ]
    )


def system_line(cluster: Cluster, layout: Layout) -> str:
    link = "NVLink" if cluster.gpu.nvlink_bandwidth else "PCIe (no NVLink)"
    return (
        f"{cluster.name}: {plural(layout.nodes, 'node')} x {layout.gpus_per_node} {cluster.gpu.name} GPUs"
        f" = {layout.gpus} GPUs,"
        f" {link} within a node, {cluster.fabric_bandwidth * 8 / 1e9:g} Gb/s of fabric per GPU;"
        f" {layout.batch} images per GPU of the global batch {layout.global_batch:,}"
    )


def compute_source(measured: MeasuredStep | None) -> str:
    if measured is None:
        return "modelled from the GPU's datasheet at the efficiencies fitted to NVIDIA's MLPerf runs"
    return (
        f"rn50perf's own step measured on one {measured.gpu} ({measured.img_s:,.0f} img/s at {measured.batch} images;"
        f" {measured.source}), the fitted floor kept for other batches"
    )


def input_lines(check: Check | None) -> list[str]:
    """For a measured step: it is the step alone, and whether rn50perf's own loader fed that rate on the machine
    that measured it (or that the check does not say)."""
    if check is None:
        return []
    measured, fed = check.step, check.fed
    if fed.img_s is None:
        said = f"whether rn50perf's own loader fed that rate on that machine is unknown ({fed.what})"
    else:
        ratio = fed.img_s / measured.img_s
        said = f"rn50perf's own loader fed {fed.img_s:,.0f} img/s ({ratio:.2f}x) on that machine ({fed.what})"
    return [f"input: the step alone: {said}; this projection assumes an input pipeline that keeps up"]


def fed_figures(check: Check | None) -> dict[str, object]:
    """For the JSON line of a measured step's projection: train.py's rate end to end in the check (null: unknown)."""
    return {} if check is None else {"end_to_end_img_s": check.fed.img_s}


def breakdown(projection: Projection, layout: Layout, epochs: Epochs) -> str:
    """The step time by component, then the epoch, the evaluations (at `epochs.count`) and the time to train."""
    step = projection.step
    across = f"all-reduce across nodes ({projection.fabric_algorithm})"
    terms = {
        f"compute ({layout.batch} images per GPU)": step.compute_s,
        "all-reduce within each node": step.allreduce_node_s,
        across: step.allreduce_fabric_s,
        "optimizer (LARS)": step.optimizer_s,
        "waiting for the slowest GPU": step.straggler_s,
    }
    feed = "host feed (decoding, overlapped)"
    lines = step_table(layout.global_batch, terms, step.device_s, feed, step.host_feed_s, width=40)
    bound = "GPU-bound" if step.device_s >= step.host_feed_s else "bound by the hosts' decoding"
    lines += [
        f"throughput {projection.throughput_img_s:,.0f} img/s ({bound}; MLPerf's: a steady block of epochs and its"
        " evaluation)",
        f"epoch {projection.epoch_s:.2f} s; evaluation {projection.evaluation_s:.3f} s,"
        f" {projection.evaluations} of them in {epochs.count} epochs",
        f"time to train ({epochs.said()}) {projection.time_to_train_min:.3f} min",
    ]
    return "\n".join(lines)


def beyond_calibration(
    cluster: Cluster, layout: Layout, projection: Projection, measured: MeasuredStep | None
) -> list[str]:
    """Where the run reaches beyond the in-sample systems (DGX A100 and H100, 1 to 64 nodes of 8 GPUs, 40 to 408
    images per GPU); nothing is widened for it beyond the ranges."""
    published = calibrate.IN_SAMPLE
    gpus = sorted({cluster.gpu.name for cluster in calibrate.CALIBRATION.clusters.values()})
    most_nodes = max(p.layout.nodes for p in published)
    beyond = []
    if cluster.gpu.name not in gpus and measured is None:
        beyond.append(
            f"GPU {cluster.gpu.name} (calibrated: {', '.join(gpus)}): its step is its datasheet's peak and bandwidth"
            " at the fitted efficiencies"
        )
    if layout.nodes > most_nodes:
        beyond.append(f"{layout.nodes} nodes (calibrated: up to {most_nodes}): the fabric's terms as modelled")
    low, high = min(p.layout.batch for p in published), max(p.layout.batch for p in published)
    if not low <= layout.batch <= high:
        beyond.append(f"{layout.batch} images per GPU (calibrated: {low} to {high})")
    if not cluster.gpu.nvlink_bandwidth or layout.gpus_per_node != 8:
        beyond.append(f"{layout.gpus_per_node} GPUs a node over {'NVLink' if cluster.gpu.nvlink_bandwidth else 'PCIe'}")
    if projection.step.host_feed_s > projection.step.device_s:
        beyond.append("the hosts' decoding binds (the in-sample runs were GPU-bound)")
    return beyond


def figures(spread: Interval[Projection], layout: Layout) -> dict[str, object]:
    """The IPU report's keys, and the per-GPU rate."""
    return uncertainty.figures(spread) | {"img_s_per_gpu": round(spread.central.throughput_img_s / layout.gpus, 1)}


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
