"""How long a weight update, an epoch and a whole MLPerf run take on a simulated IPU system.

A handful of formulas over a ModelProfile (FLOPs and bytes per stage, measured from the real model) and a System
(chip rates, links, gateways, hosts), with constants of which calibrate.py fits three to Graphcore's POD16, POD64
and POD128 results and uncertainty.py gives the rest ranges. Each term is one small function; the step takes the
slower of the device and the host that feeds it. Around the steps, a run does what Graphcore's MLPerf train.py of
the system's round did (mlcommons/training_results_v1.1 and training_results_v2.0,
Graphcore/benchmarks/resnet/implementations/tensorflow/): host round trips averaged over every host process, a
checkpoint every few epochs, and the saved checkpoints evaluated after training; ROUNDS says where v2.0's differs.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

from projection.ipu.config import MLPERF_ROUNDS, System
from projection.profile import ModelProfile, StageProfile
from projection.run import Schedule


@dataclass(frozen=True)
class RunShape:
    """How a run lays the model out over the system. Pipeline stages (IPUs per replica) come from the profile."""

    replicas: int
    micro_batch: int  # what one replica's first stage takes per micro-batch; must match the profile's
    grad_accum: int  # micro-batches per weight update per replica (K)
    device_iterations: int = 1  # weight updates per host round trip (updates_per_host_call: Graphcore's)
    fp16: bool = True  # fp16 compute and gradients (fp16 peak); False: fp32
    fp32_master: bool = False  # fp32 master weights and momentum (16.32); False: stored at the compute dtype
    merged_allreduce: bool = True  # one collective for all gradients; False: one per gradient tensor
    optimizer_in_streaming: bool = False  # momentum lives in streaming memory (off-chip DDR)
    sharded: bool = False  # the stages take turns (one IPU busy at a time) instead of pipelining

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.replicas


@dataclass(frozen=True)
class Constants:
    """The free constants. Three are fitted by `python -m projection.ipu.calibrate` to the steady epochs of the
    in-sample systems (compute_efficiency to POD16, update_overhead_s to POD16 against POD64, gateway_efficiency to
    POD128); eval_overhead_s is fitted to their evaluations; the rest are measured in their logs or assumed, each
    with the range and reason in projection/ipu/assumptions.py."""

    compute_efficiency: float = 0.2487  # fraction of the fp16/fp32 peak reached; fitted
    memory_efficiency: float = 0.5  # fraction of SRAM bandwidth reached
    collective_latency_s: float = 10e-6  # per ring step over IPU-Links: a cross-IPU sync and a transfer
    gateway_latency_s: float = 12e-6  # per ring step between POD64s: IPU to gateway, GW-Link, gateway to IPU
    gateway_efficiency: float = 0.06226  # fraction of the GW-Links' line rate the cross-POD phase reaches; fitted
    gateway_growth: float = 0.37  # how the cross-POD phase grows beyond two POD64s: (P - 1) ** gateway_growth
    sync_s: float = 1e-6  # one sync of every IPU in the IPU-Link domain (one POD64 or less)
    gateway_sync_s: float = 12e-6  # one sync that spans POD64s, relayed by the gateways
    update_overhead_s: float = 2.931e-3  # the weight update program's fixed cost beyond its memory traffic; fitted
    update_cycles_share: float = 0.5  # the share of update_overhead_s paid in chip cycles (faster at a higher clock)
    loader_img_s_per_core: float = 649.0  # bench.loader's rate per worker core (docs/ipu_sim.md says where from)
    host_sync_s: float = 1e-3  # one host round trip's fixed cost: the engine run returns, outfeed read, next run
    host_hop_s: float = 50e-6  # one message between host processes in the outfeed's Horovod average
    instance_sync_s: float = 50e-6  # per host process and round trip, paid one process after another
    checkpoint_s: float = 2.0  # instance 0 writing a checkpoint while every replica waits; in the logs
    variables_checkpoint_s: float = 0.12  # the same without its MetaGraphDef, as v2.0 writes it: its variables alone
    catch_up_s: float = 0.37  # the epoch after a checkpoint runs slower by this much; in the logs
    eval_setup_s: float = 17.4  # once per run: the validation graph attached, the first evaluation loaded
    eval_overhead_s: float = 0.1035  # per evaluation beyond its forward passes; fitted
    broadcast_s_per_instance: float = 0.018  # per evaluation, the checkpoint sent from instance 0 to each other


@dataclass(frozen=True)
class StepTime:
    """One weight update, by component (seconds). The device terms add up; the host feed overlaps them."""

    compute_s: float  # (K + S - 1) pipeline cycles of the slowest stage: fill and drain included
    exchange_s: float  # activations and their gradients between pipeline stages, over IPU-Links
    allreduce_s: float  # gradients across replicas over IPU-Links (the whole ring, or reduce-scatter + all-gather)
    gateway_s: float  # each shard all-reduced across POD64s over the gateways (0 within one POD64)
    update_s: float  # the optimizer step
    sync_s: float  # the system-wide syncs that separate accumulation, collective and update
    host_sync_s: float  # this step's share of a host round trip
    host_feed_s: float  # the host decoding and sending this step's images
    busy: float  # the share of the replica's IPUs at work during the compute: idle ones fill or drain the
    # pipeline, or wait their turn when sharded

    @property
    def device_s(self) -> float:
        return (
            self.compute_s
            + self.exchange_s
            + self.allreduce_s
            + self.gateway_s
            + self.update_s
            + self.sync_s
            + self.host_sync_s
        )

    @property
    def total_s(self) -> float:
        return max(self.device_s, self.host_feed_s)


@dataclass(frozen=True)
class Projection:
    throughput_img_s: float  # as MLPerf's logs give it: train_images / the median logged epoch
    epoch_s: float  # the median logged epoch
    steady_epoch_s: float  # a logged epoch with no checkpoint in it or before it
    training_s: float  # every epoch, checkpoints included
    evaluations_s: float  # all evaluations of the run together, after training
    time_to_train_min: float
    step: StepTime
    host_calls_per_epoch: int
    checkpoints: int


def validate(profile: ModelProfile, system: System, shape: RunShape) -> None:
    """Refuse shapes the system cannot run, naming the figures."""
    stages = len(profile.stages)
    if shape.replicas * stages > system.ipus:
        raise ValueError(
            f"{shape.replicas} replicas x {stages} IPUs per replica = {shape.replicas * stages} IPUs, "
            f"but {system.name} has {system.ipus}"
        )
    if shape.grad_accum < stages and not shape.sharded:
        raise ValueError(f"gradient accumulation {shape.grad_accum} is below the {stages} pipeline stages")
    if shape.micro_batch != profile.micro_batch:
        raise ValueError(f"micro-batch {shape.micro_batch}, but the profile was measured at {profile.micro_batch}")


def peak_flops(system: System, shape: RunShape) -> float:
    """The chip's peak at the run's compute dtype."""
    return system.chip.fp16_flops if shape.fp16 else system.chip.fp32_flops


def stage_s(stage: StageProfile, system: System, shape: RunShape, constants: Constants) -> float:
    """One micro-batch through a stage (forward, recompute, backward): bound by arithmetic or by SRAM traffic."""
    flops = stage.forward_flops + stage.backward_flops + stage.recompute_flops
    arithmetic = flops / (peak_flops(system, shape) * constants.compute_efficiency)
    traffic = stage.memory_bytes / (system.chip.sram_bandwidth * constants.memory_efficiency)
    return max(arithmetic, traffic)


def pipeline_cycles(stages: int, grad_accum: int) -> int:
    """K micro-batches through S stages take K + S - 1 cycles: the pipeline fills and drains once per update."""
    return grad_accum + stages - 1


def exchange_s(profile: ModelProfile, system: System) -> float:
    """Per cycle, the widest stage boundary's activation goes forward and its gradient comes back (none for one
    stage: the last stage sends nothing)."""
    return max(2 * stage.output_bytes for stage in profile.stages) / system.chip.link_bandwidth


def compute_s(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> float:
    """The update's micro-batches through the stages: pipelined, (K + S - 1) cycles of the slowest stage; sharded,
    every stage in turn for each of the K micro-batches, the other IPUs idle."""
    times = [stage_s(stage, system, shape, constants) for stage in profile.stages]
    if shape.sharded:
        return shape.grad_accum * sum(times)
    return pipeline_cycles(len(times), shape.grad_accum) * max(times)


def exchanges_s(profile: ModelProfile, system: System, shape: RunShape) -> float:
    """Activations and their gradients between stages in an update: pipelined, the widest boundary each cycle;
    sharded, each boundary in turn for each micro-batch."""
    if shape.sharded:
        return shape.grad_accum * sum(2 * stage.output_bytes for stage in profile.stages) / system.chip.link_bandwidth
    return pipeline_cycles(len(profile.stages), shape.grad_accum) * exchange_s(profile, system)


def utilisation(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> float:
    """The share of the replica's IPU time in the update's compute that its stages are busy."""
    busy = shape.grad_accum * sum(stage_s(stage, system, shape, constants) for stage in profile.stages)
    return busy / (len(profile.stages) * compute_s(profile, system, shape, constants))


def ring_allreduce_s(nbytes: float, ranks: int, bandwidth: float, latency_s: float, collectives: int) -> float:
    """Ring all-reduce: a reduce-scatter then an all-gather, each rank sending (n-1)/n of the data in n-1 steps
    per phase, each step paying `latency_s` per collective."""
    steps = 2 * (ranks - 1)
    return steps / ranks * nbytes / bandwidth + latency_s * collectives * steps


def pods(system: System, shape: RunShape, stages: int) -> int:
    """IPU-Link domains (POD64s) the run spans: IPU-Links join at most `ipus_per_pod` IPUs."""
    return math.ceil(shape.replicas * stages / system.chip.ipus_per_pod)


def gradient_bytes(profile: ModelProfile, shape: RunShape) -> float:
    """Stages reduce their own gradients concurrently, so the largest stage sets the bytes."""
    return max(stage.param_count for stage in profile.stages) * (2 if shape.fp16 else 4)


MERGE_BUFFER_BYTES = 52_428_800  # configs.yml: max_cross_replica_buffer_size in the v1.1 ResNet-50 recipes


def collectives(profile: ModelProfile, shape: RunShape) -> int:
    """Merged collectives of at most `max_cross_replica_buffer_size` bytes each (ResNet-50's fp16 gradients, 51.1
    MB, fit in one), or one per gradient tensor. Per-tensor counts per stage are not profiled, so every stage
    counts the whole model's tensors (an upper bound)."""
    if shape.merged_allreduce:
        return math.ceil(gradient_bytes(profile, shape) / MERGE_BUFFER_BYTES)
    return profile.gradient_tensors


def allreduce_s(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> float:
    """The IPU-Link phases: one ring over the replicas within one POD64; beyond it, a reduce-scatter within each
    POD64 before the gateway phase and an all-gather after, together one ring's worth over each POD's replicas.

    GCL runs collectives on the IPUs "over the IPU-Links and GW-Links" (graphcore/tensorflow,
    docs/distributed_training.rst), "syncful over IPU-Links and syncless over gw links" (Poplar 2.4 GCL
    options); the three-phase split is the hierarchical all-reduce those two link classes imply."""
    per_pod = math.ceil(shape.replicas / pods(system, shape, len(profile.stages)))
    return ring_allreduce_s(
        gradient_bytes(profile, shape),
        per_pod,
        system.chip.link_bandwidth,
        constants.collective_latency_s,
        collectives(profile, shape),
    )


def gateway_share(system: System, constants: Constants) -> float:
    """Bytes/s one IPU gets across POD64s: its machine's GW-Links are shared by the machine's IPUs, at the
    efficiency a collective reaches. "GW-Link - 2x 100Gbps Gateway-Links for communication between Bow Pods"
    (docs.graphcore.ai, Bow-2000 datasheet); the IPU-M2000 has the same two 100 GbE GW-Link ports."""
    return system.chip.gateway_bandwidth * constants.gateway_efficiency / system.chip.ipus_per_machine


def gateway_s(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> float:
    """The cross-POD phase: after the reduce-scatter each IPU holds 1/n of the gradients, and the POD64s all-reduce
    those shards over the gateways, every IPU's shard at once (0 within one POD64). The in-sample systems span at
    most two POD64s, which pins this phase's cost there (a ring of two) but not how it grows beyond: it is that cost
    times (P - 1) ** gateway_growth, from 0 (one bottleneck crossing that does not multiply) to 1 (a cost per ring
    step); the ring's own bandwidth term, 2 (P - 1) / P, grows as gateway_growth = 0.37 from 2 to 4 POD64s."""
    spanned = pods(system, shape, len(profile.stages))
    if spanned == 1:
        return 0.0
    shard = gradient_bytes(profile, shape) / math.ceil(shape.replicas / spanned)
    pair = ring_allreduce_s(
        shard, 2, gateway_share(system, constants), constants.gateway_latency_s, collectives(profile, shape)
    )
    growth: float = (spanned - 1) ** constants.gateway_growth
    return pair * growth


SYNCS_PER_UPDATE = 3  # the accumulation loop ends, the collective ends, the update ends: each a program switch


def sync_s(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> float:
    """The system-wide syncs between the programs of one weight update; across POD64s a sync goes through the
    gateways and costs what a gateway sync costs."""
    spanned = pods(system, shape, len(profile.stages))
    return SYNCS_PER_UPDATE * (constants.sync_s if spanned == 1 else constants.gateway_sync_s)


FITTED_CLOCK_HZ = 1.33e9  # the GC200's (configs/device/chip/gc200.yaml), whose results update_overhead_s is fitted to


def update_fixed_s(system: System, constants: Constants) -> float:
    """The update program's fixed cost on the system's chip: fitted in seconds on the GC200, of which
    `update_cycles_share` is cycles (its compute sets and their syncs within each IPU), faster at a higher clock, and
    the rest seconds whatever the clock (what else the fit absorbs per update: program switches, stream copies)."""
    faster = constants.update_cycles_share * (1 - FITTED_CLOCK_HZ / system.chip.clock_hz)
    return constants.update_overhead_s * (1 - faster)


def update_s(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> float:
    """The optimizer reads the gradient and reads and writes weights and momentum (momentum may live off chip),
    plus the update program's fixed cost: its per-tensor compute sets and the syncs between them."""
    params = max(stage.param_count for stage in profile.stages)
    grad = 2 if shape.fp16 else 4
    weights = momentum = 2 * (4 if shape.fp32_master or not shape.fp16 else 2)  # read and written back
    on_chip = grad + weights + (0 if shape.optimizer_in_streaming else momentum)
    sram = params * on_chip / (system.chip.sram_bandwidth * constants.memory_efficiency)
    streamed = params * momentum / system.chip.streaming_bandwidth if shape.optimizer_in_streaming else 0.0
    return sram + streamed + update_fixed_s(system, constants)


def host_feed_s(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> float:
    """The hosts decode the step's images and each replica's first IPU receives its own over its host link."""
    decode = shape.global_batch / (system.host_cores * constants.loader_img_s_per_core)
    send = shape.grad_accum * profile.input_bytes / system.chip.host_link_bandwidth
    return max(decode, send)


def step_time(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> StepTime:
    """One weight update on every replica at once."""
    validate(profile, system, shape)
    return StepTime(
        compute_s=compute_s(profile, system, shape, constants),
        exchange_s=exchanges_s(profile, system, shape),
        allreduce_s=allreduce_s(profile, system, shape, constants),
        gateway_s=gateway_s(profile, system, shape, constants),
        update_s=update_s(profile, system, shape, constants),
        sync_s=sync_s(profile, system, shape, constants),
        host_sync_s=host_call_s(shape, constants) / shape.device_iterations,
        host_feed_s=host_feed_s(profile, system, shape, constants),
        busy=utilisation(profile, system, shape, constants),
    )


REPLICAS_PER_INSTANCE = 2  # run_and_time.sh: poprun --num-instances $REPLICAS/2, one host process per 2 replicas
LOGS_PER_EPOCH = 5  # configs.yml: logs_per_epoch 5 in mk2_resnet50_mlperf_pod16, which the _lars recipes inherit
MOST_UPDATES_PER_CALL = 1000  # train.py: --batches-per-step, 1000 by default and not set by the _lars recipes


def updates_per_host_call(train_images: int, global_batch: int) -> int:
    """Graphcore's train.py runs the device loop for one log interval per session.run (`iterations_per_step`):
    the updates of an epoch (`NUM_IMAGES // total_batch_size`) over `logs_per_epoch`, capped by batches_per_step.
    80 updates at POD16's batch of 3200, 66 at POD64's 3840, 50 at POD128's 5120."""
    log_every = max(1, train_images // global_batch // LOGS_PER_EPOCH)
    if log_every < MOST_UPDATES_PER_CALL:
        return log_every
    return log_every // round(log_every / MOST_UPDATES_PER_CALL)


def instances(shape: RunShape) -> int:
    """Host processes (PopDist instances), each driving two replicas."""
    return math.ceil(shape.replicas / REPLICAS_PER_INSTANCE)


def host_call_s(shape: RunShape, constants: Constants) -> float:
    """One host round trip, while every IPU waits: the engine run returns, each instance reads its outfeed and
    averages it over all instances (train.py: `strategy.reduce(MEAN)`, a Horovod allreduce; MPI's recursive
    doubling for small messages takes 2 log2(n) messages), the next run starts. Whatever is paid once per instance
    in turn (Horovod's coordinator hears from each rank; the replicated program waits for the last engine run to
    start) grows linearly with them: `instance_sync_s`, which the in-sample results allow from 0 up to where it
    explains POD128's cross-POD excess alone."""
    n = instances(shape)
    hops = 2 * math.ceil(math.log2(n)) if n > 1 else 0
    return constants.host_sync_s + hops * constants.host_hop_s + n * constants.instance_sync_s


def eval_image_s(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> float:
    """One validation image's share of an evaluation: forward passes spread over the run's IPUs, no faster than
    the hosts decode."""
    forward_flops = sum(stage.forward_flops for stage in profile.stages) / profile.micro_batch
    ipus = shape.replicas * len(profile.stages)
    device = forward_flops / (ipus * peak_flops(system, shape) * constants.compute_efficiency)
    decode = 1 / (system.host_cores * constants.loader_img_s_per_core)
    return max(device, decode)


def evaluation_s(profile: ModelProfile, system: System, shape: RunShape, constants: Constants, images: int) -> float:
    """One evaluation of a saved checkpoint: its forward passes and a fixed cost (the validation engine run and the
    accuracy averaged over the instances), after instance 0 has loaded the checkpoint and sent it to every other
    instance (validation.py loads on instance 0 only; the gaps between evaluations in the v1.1 logs grow with the
    instances: 0.12 s over 8, 0.45 s over 32, 1.19 s over 64)."""
    broadcast = (instances(shape) - 1) * constants.broadcast_s_per_instance
    return images * eval_image_s(profile, system, shape, constants) + constants.eval_overhead_s + broadcast


def host_calls_per_epoch(schedule: Schedule, shape: RunShape) -> int:
    """Host round trips in a steady logged epoch: train.py logs an epoch's end between round trips, so a logged
    epoch holds whole ones (5 in the v1.1 recipes; at POD64 66 updates each, 330 of its 333.6)."""
    updates = schedule.train_images / shape.global_batch
    return max(1, round(updates / shape.device_iterations))


@dataclass(frozen=True)
class Round:
    """What one MLPerf round's Graphcore train.py (train_process) does around the steps that the other's does not."""

    offset_from_last: bool  # no ckpt_epochs_offset in its recipes: the checkpoints count back from the last epoch
    meta_graph: bool  # each checkpoint writes the MetaGraphDef as well as the variables (saver.save's default)


# Graphcore/benchmarks/resnet/implementations/tensorflow/ in mlcommons/training_results_v1.1 and v2.0. Both checkpoint
# every epochs_per_ckpt (4) epochs and at the end, from instance 0 while every replica waits, and after training set
# up the validation graph once and evaluate every checkpoint (validation.py); neither stops early at the target.
# v1.1's configs.yml sets ckpt_epochs_offset per recipe; v2.0's sets none, and its train.py then takes
# `epochs % epochs_per_ckpt`, and saves with `write_meta_graph=False`.
ROUNDS = {
    "v1.1": Round(offset_from_last=False, meta_graph=True),
    "v2.0": Round(offset_from_last=True, meta_graph=False),
}
assert tuple(ROUNDS) == MLPERF_ROUNDS


def mlperf_round(system: System) -> Round:
    """The round whose train.py runs on `system` (configs/device/<system>.yaml: mlperf_round, which the config
    checks; a system built directly is refused here)."""
    if system.mlperf_round not in ROUNDS:
        raise ValueError(f"{system.name}: mlperf_round {system.mlperf_round!r} is not one of {', '.join(ROUNDS)}")
    return ROUNDS[system.mlperf_round]


def checkpoint_schedule(system: System, schedule: Schedule) -> Schedule:
    """The schedule as the system's round checkpoints it: v1.1's recipes set the first checkpoint's epoch
    (ckpt_epochs_offset), which `first_eval` gives; v2.0's train.py counts back from the last epoch, `epochs %
    epochs_per_ckpt` (an offset of 0 puts the first at epochs_per_ckpt), so its last checkpoint is on the cadence."""
    if not mlperf_round(system).offset_from_last:
        return schedule
    return dataclasses.replace(schedule, first_eval=schedule.epochs % schedule.eval_every or schedule.eval_every)


def checkpoint_pause_s(system: System, constants: Constants) -> float:
    """One checkpoint while every replica waits: v1.1's, as its logs time it, wrote the MetaGraphDef too; v2.0's
    (`write_meta_graph=False`) moves the variables alone, as a restore before each v1.1 evaluation does."""
    return constants.checkpoint_s if mlperf_round(system).meta_graph else constants.variables_checkpoint_s


@dataclass(frozen=True)
class Training:
    """The training loop as the MLPerf log times it: each epoch's seconds, and the checkpoints written (each is
    evaluated after training)."""

    epochs_s: list[float]
    checkpoints: int


def training_loop(system: System, schedule: Schedule, shape: RunShape, call_s: float, constants: Constants) -> Training:
    """Graphcore's train.py training loop: round trips of `device_iterations` updates while `i < iterations` (the
    last one runs in full); before a round trip, the epoch ends if the round trip would end in the next one; after
    it, a checkpoint if it crossed `ckpt_epochs_offset` plus a multiple of `epochs_per_ckpt` epochs (or ended the
    run), and the round trip after a checkpoint catches up. So a checkpoint lands in the epoch it closes at POD16
    and POD128, and in the next one at POD64, as their logs show. The system's round places and prices them."""
    schedule, pause_s = checkpoint_schedule(system, schedule), checkpoint_pause_s(system, constants)
    batch, images, epochs = shape.global_batch, schedule.train_images, schedule.epochs
    iterations, per_epoch, step = images * epochs // batch, images // batch, shape.device_iterations
    offset, every = schedule.first_eval * per_epoch, schedule.eval_every * per_epoch
    logged, current, log_epoch, checkpoints, catching_up, i = [], 0.0, 1, 0, False, 0
    while i < iterations:
        epoch = batch * (i + step) / images
        if math.floor(epoch) == log_epoch and round(epoch) != epochs:
            logged.append(current)
            current, log_epoch = 0.0, round(epoch) + 1
        crossed = (i - offset) // every < (i + step - offset) // every or i + step >= iterations
        checkpoint = i >= offset - step and crossed and not (round(epoch) == epochs and i + step < iterations)
        current += call_s + (constants.catch_up_s if catching_up else 0.0)
        current += pause_s if checkpoint else 0.0
        checkpoints += checkpoint
        catching_up, i = checkpoint, i + step
    return Training([*logged, current], checkpoints)


def project(
    profile: ModelProfile, system: System, shape: RunShape, constants: Constants, schedule: Schedule
) -> Projection:
    """Throughput as MLPerf's median epoch gives it, and time-to-train: the epochs back to back with their
    checkpoints, then the validation graph set up once and each checkpoint evaluated, as Graphcore's v1.1 and v2.0
    runs did (v1.1's logs: run_stop follows the last evaluation; nothing else inside the timed region)."""
    step = step_time(profile, system, shape, constants)
    call_s = shape.device_iterations * step.total_s
    training = training_loop(system, schedule, shape, call_s, constants)
    evaluations = constants.eval_setup_s + training.checkpoints * evaluation_s(
        profile, system, shape, constants, schedule.eval_images
    )
    median, training_s = statistics.median(training.epochs_s), sum(training.epochs_s)
    calls = host_calls_per_epoch(schedule, shape)
    return Projection(
        schedule.train_images / median,
        median,
        calls * call_s,
        training_s,
        evaluations,
        (training_s + evaluations) / 60,
        step,
        calls,
        training.checkpoints,
    )


def report(projection: Projection, shape: RunShape, stages: int, epochs: float) -> str:
    """The step-time breakdown and the projected run, as run.mode=project prints them."""
    step = projection.step
    how = (
        f"{shape.grad_accum} x {stages} stages in turn"
        if shape.sharded
        else f"{pipeline_cycles(stages, shape.grad_accum)} pipeline cycles"
    )
    terms = {
        f"compute ({how})": step.compute_s,
        "exchange between stages": step.exchange_s,
        "all-reduce within POD64s (IPU-Links)": step.allreduce_s,
        "all-reduce across POD64s (gateways)": step.gateway_s,
        "weight update": step.update_s,
        f"system syncs ({SYNCS_PER_UPDATE} per update)": step.sync_s,
        f"host round trip (1 per {shape.device_iterations} updates)": step.host_sync_s,
    }
    batch = f"{shape.micro_batch} x {shape.grad_accum} x {shape.replicas} replicas = {shape.global_batch} images"
    lines = [f"step time of one weight update ({batch}), ms"]
    lines += [f"  {name:<40}{1e3 * seconds:>10.3f}" for name, seconds in terms.items()]
    lines.append(f"  {'device, total':<40}{1e3 * step.device_s:>10.3f}")
    if stages > 1:
        busy = 100 * step.busy
        lines.append(f"  the replica's {stages} IPUs busy in its compute: {busy:.0f} % ({100 - busy:.0f} % idle)")
    lines.append(f"  {'host feed (decode and send, overlapped)':<40}{1e3 * step.host_feed_s:>10.3f}")
    bound = "device" if step.device_s >= step.host_feed_s else "host feed"
    checkpoints = projection.training_s - epochs * projection.steady_epoch_s
    lines += [
        f"throughput {projection.throughput_img_s:,.0f} img/s ({bound}-bound; MLPerf's median epoch)",
        f"epoch {projection.epoch_s:.2f} s (median), {projection.steady_epoch_s:.2f} s without a checkpoint"
        f" ({projection.host_calls_per_epoch} host round trips)",
        f"training {projection.training_s:.1f} s, of which checkpoints and the last round trip {checkpoints:.1f} s",
        f"evaluations {projection.evaluations_s:.1f} s ({projection.checkpoints} saved checkpoints, after training)",
        f"time to train ({epochs:g} epochs) {projection.time_to_train_min:.3f} min",
    ]
    return "\n".join(lines)
