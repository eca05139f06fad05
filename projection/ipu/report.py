"""run.mode=project's answer for a simulated IPU system: the projected time to train and throughput with the ranges
the assumed constants allow (each corner refitted to the in-sample results, as the central value is), the memory
table, the step time by component, how far the run reaches beyond the calibrated systems, and one JSON line."""

from __future__ import annotations

import json

from projection import convergence, uncertainty
from projection.ipu import calibrate, cost
from projection.ipu.assumptions import ASSUMPTIONS
from projection.ipu.config import System
from projection.ipu.cost import Constants, Projection
from projection.ipu.plan import Plan
from projection.run import Schedule
from projection.uncertainty import Interval


def text(planned: Plan, system: System, schedule: Schedule, global_batch: int) -> str:
    """The system's memory plan, the step time by component, and the projected epoch and time-to-train, with the
    range the assumed constants allow, each corner refitted to the in-sample results as the central value is, and
    how far the run reaches beyond them; last, one JSON line."""
    fit = calibrate.CALIBRATION
    shape = planned.layout.shape(schedule.train_images)

    def at(constants: Constants) -> Projection:
        return cost.project(planned.profile, system, shape, constants, schedule)

    spread = uncertainty.widened(fit.ranges(at), fit.evidence)
    beyond = beyond_calibration(planned, system, shape)
    notes = [
        f"epochs: {schedule.epochs} (run.max_epochs): the recipe trains them all, then evaluates its checkpoints",
        convergence.room_to_converge(schedule.epochs, global_batch),
        *checkpoints_moved(system, schedule),
    ]
    return report(planned, system, shape, spread, fit.central, schedule.epochs, beyond, notes)


def checkpoints_moved(system: System, schedule: Schedule) -> list[str]:
    """A line where the system's MLPerf round checkpoints (and so evaluates) after other epochs than mlperf.first_eval
    says: v2.0's train.py counts them back from the last epoch."""
    run = cost.checkpoint_schedule(system, schedule)
    if run.first_eval == schedule.first_eval:
        return []
    epochs = ", ".join(map(str, run.eval_epochs()))
    return [
        f"checkpoints after epochs {epochs}, not from mlperf.first_eval={schedule.first_eval}: MLPerf"
        f" {system.mlperf_round}'s train.py counts them back from the last epoch"
    ]


def beyond_calibration(planned: Plan, system: System, shape: cost.RunShape) -> list[str]:
    """Where the run reaches beyond the in-sample systems (their POD64s, chip, accumulations and host processes,
    and the recipe's 20 images on one IPU per replica); nothing is widened for it beyond the ranges."""
    stages = len(planned.profile.stages)
    samples = {published.device: calibrate.shape(published) for published in calibrate.IN_SAMPLE}
    calibrated = calibrate.CALIBRATION.systems
    most_pods = max(cost.pods(calibrated[name], sample, 1) for name, sample in samples.items())
    chips = sorted({chip.chip.name for chip in calibrated.values()})
    rounds = sorted({known.mlperf_round for known in calibrated.values()})
    accumulations = [sample.grad_accum for sample in samples.values()]
    processes = [cost.instances(sample) for sample in samples.values()]
    beyond = []
    if cost.pods(system, shape, stages) > most_pods:
        spanned = cost.pods(system, shape, stages)
        beyond.append(
            f"{spanned} POD64s (calibrated: up to {most_pods}): the cross-POD phase grows as gateway_growth assumes"
        )
    if system.chip.name not in chips:
        beyond.append(
            f"chip {system.chip.name} (calibrated: {', '.join(chips)}): the update program's fixed cost scales with its"
            " clock by update_cycles_share; its other per-update costs are theirs in seconds"
        )
    if system.mlperf_round not in rounds:
        beyond.append(
            f"MLPerf {system.mlperf_round}'s checkpoints (calibrated: {', '.join(rounds)}): without the MetaGraphDef,"
            " variables_checkpoint_s assumes their cost"
        )
    if not min(accumulations) <= shape.grad_accum <= max(accumulations):
        beyond.append(
            f"{shape.grad_accum} micro-batches per update (calibrated: {min(accumulations)} to {max(accumulations)})"
        )
    if shape.micro_batch != calibrate.RECIPE.micro_batch or stages > 1:
        beyond.append("a micro-batch or pipeline other than the recipe's (20 images on one IPU)")
    if cost.instances(shape) > max(processes):
        beyond.append(f"{cost.instances(shape)} host processes (calibrated: {min(processes)} to {max(processes)})")
    return beyond


def report(
    planned: Plan,
    system: System,
    shape: cost.RunShape,
    spread: Interval[Projection],
    central: Constants,
    epochs: int,
    beyond: list[str],
    notes: list[str],
) -> str:
    """The projected time to train and throughput first, then the system (and `notes` on how its round runs), the
    memory table, the cost model's report and its ranges, where it extrapolates, and last one JSON line of figures."""
    memory = {"ipu_memory_mb": [round(row.total_mb, 1) for row in planned.memory.rows], "fits": planned.memory.fits}
    hosts = f"{system.hosts} host{'s' if system.hosts > 1 else ''}, {system.host_cores} host cores"
    return "\n".join(
        [
            uncertainty.headline(spread, f"{epochs} epochs") + "\n",
            f"{system.name}: {system.ipus} {system.chip.name} IPUs, {hosts}",
            *notes,
            f"{planned.memory.table()}\n{planned.memory.suggestion()}\n",
            cost.report(spread.central, shape, len(planned.profile.stages), epochs),
            uncertainty.report(spread, central, ASSUMPTIONS),
            uncertainty.reach(beyond),
            json.dumps(uncertainty.figures(spread) | memory | {"beyond_calibration": beyond}),
        ]
    )
