"""How long a weight update, an epoch and a whole MLPerf run take on a simulated IPU system.

A handful of formulas over a ModelProfile (FLOPs and bytes per stage, measured from the real model) and a System
(chip rates, links, gateways, hosts), with constants of which calibrate.py fits three to Graphcore's POD16 result
and uncertainty.py gives the rest ranges. Each term is one small function; the step takes the slower of the
device and the host that feeds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from backends.ipu_sim.profile import ModelProfile, StageProfile
from configs.hardware import System


@dataclass(frozen=True)
class RunShape:
    """How a run lays the model out over the system. Pipeline stages (IPUs per replica) come from the profile."""

    replicas: int
    micro_batch: int  # what one replica's first stage takes per micro-batch; must match the profile's
    grad_accum: int  # micro-batches per weight update per replica (K)
    device_iterations: int = 1  # weight updates per host round trip
    fp16: bool = True  # fp16 compute and gradients (fp16 peak); False: fp32
    fp32_master: bool = False  # fp32 master weights and momentum (16.32); False: stored at the compute dtype
    merged_allreduce: bool = True  # one collective for all gradients; False: one per gradient tensor
    optimizer_in_streaming: bool = False  # momentum lives in streaming memory (off-chip DDR)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.replicas


@dataclass(frozen=True)
class Constants:
    """The free constants. Three are fitted to the POD16 result by `python -m backends.ipu_sim.calibrate`
    (compute_efficiency, eval_overhead_s, run_overhead_s); the rest are assumed, each with the range and reason
    in backends/ipu_sim/uncertainty.py, because POD16's one layout cannot tell them from compute."""

    compute_efficiency: float = 0.2446  # fraction of the fp16/fp32 peak reached; fitted to POD16 throughput
    memory_efficiency: float = 0.5  # fraction of SRAM bandwidth reached
    collective_latency_s: float = 10e-6  # per ring step over IPU-Links: a cross-IPU sync and a transfer
    gateway_latency_s: float = 12e-6  # per ring step between POD64s: IPU to gateway, GW-Link, gateway to IPU
    gateway_efficiency: float = 0.8  # fraction of the GW-Links' line rate a collective reaches
    sync_s: float = 1e-6  # one sync of every IPU in the IPU-Link domain (one POD64 or less)
    gateway_sync_s: float = 12e-6  # one sync that spans POD64s, relayed by the gateways
    update_overhead_s: float = 1.5e-3  # the weight update program's fixed cost beyond its memory traffic
    loader_img_s_per_core: float = 649.0  # bench.loader's rate per worker core (docs/ipu_sim.md says where from)
    host_sync_s: float = 1e-3  # one host round trip (stream callbacks, engine run) per device_iterations
    eval_overhead_s: float = 1.898  # per evaluation beyond its forward passes; fitted to POD16's 25 s of evaluation
    run_overhead_s: float = 27.07  # per run, inside the timed region; fitted to POD16 time-to-train


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
    throughput_img_s: float
    epoch_s: float
    eval_s: float  # all evaluations of the run together
    time_to_train_min: float
    step: StepTime


def validate(profile: ModelProfile, system: System, shape: RunShape) -> None:
    """Refuse shapes the system cannot run, naming the figures."""
    stages = len(profile.stages)
    if shape.replicas * stages > system.ipus:
        raise ValueError(
            f"{shape.replicas} replicas x {stages} IPUs per replica = {shape.replicas * stages} IPUs, "
            f"but {system.name} has {system.ipus}"
        )
    if shape.grad_accum < stages:
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


def collectives(profile: ModelProfile, shape: RunShape) -> int:
    """One merged collective, or one per gradient tensor. Per-tensor counts per stage are not profiled, so every
    stage counts the whole model's tensors (an upper bound)."""
    return 1 if shape.merged_allreduce else profile.gradient_tensors


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
    """The cross-POD phase: after the reduce-scatter each IPU holds 1/n of the gradients, and the POD64s
    all-reduce those shards in a ring over the gateways, every IPU's shard at once (0 within one POD64)."""
    spanned = pods(system, shape, len(profile.stages))
    if spanned == 1:
        return 0.0
    shard = gradient_bytes(profile, shape) / math.ceil(shape.replicas / spanned)
    return ring_allreduce_s(
        shard, spanned, gateway_share(system, constants), constants.gateway_latency_s, collectives(profile, shape)
    )


SYNCS_PER_UPDATE = 3  # the accumulation loop ends, the collective ends, the update ends: each a program switch


def sync_s(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> float:
    """The system-wide syncs between the programs of one weight update; across POD64s a sync goes through the
    gateways and costs what a gateway sync costs."""
    spanned = pods(system, shape, len(profile.stages))
    return SYNCS_PER_UPDATE * (constants.sync_s if spanned == 1 else constants.gateway_sync_s)


def update_s(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> float:
    """The optimizer reads the gradient and reads and writes weights and momentum (momentum may live off chip),
    plus the update program's fixed cost: its per-tensor compute sets and the syncs between them."""
    params = max(stage.param_count for stage in profile.stages)
    grad = 2 if shape.fp16 else 4
    weights = momentum = 2 * (4 if shape.fp32_master or not shape.fp16 else 2)  # read and written back
    on_chip = grad + weights + (0 if shape.optimizer_in_streaming else momentum)
    sram = params * on_chip / (system.chip.sram_bandwidth * constants.memory_efficiency)
    streamed = params * momentum / system.chip.streaming_bandwidth if shape.optimizer_in_streaming else 0.0
    return sram + streamed + constants.update_overhead_s


def host_feed_s(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> float:
    """The hosts decode the step's images and each replica's first IPU receives its own over its host link."""
    decode = shape.global_batch / (system.host_cores * constants.loader_img_s_per_core)
    send = shape.grad_accum * profile.input_bytes / system.chip.host_link_bandwidth
    return max(decode, send)


def step_time(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> StepTime:
    """One weight update on every replica at once."""
    validate(profile, system, shape)
    stages = len(profile.stages)
    cycles = pipeline_cycles(stages, shape.grad_accum)
    return StepTime(
        compute_s=cycles * max(stage_s(stage, system, shape, constants) for stage in profile.stages),
        exchange_s=cycles * exchange_s(profile, system),
        allreduce_s=allreduce_s(profile, system, shape, constants),
        gateway_s=gateway_s(profile, system, shape, constants),
        update_s=update_s(profile, system, shape, constants),
        sync_s=sync_s(profile, system, shape, constants),
        host_sync_s=constants.host_sync_s / shape.device_iterations,
        host_feed_s=host_feed_s(profile, system, shape, constants),
    )


def eval_image_s(profile: ModelProfile, system: System, shape: RunShape, constants: Constants) -> float:
    """One validation image's share of an evaluation: forward passes spread over the run's IPUs, no faster than
    the hosts decode."""
    forward_flops = sum(stage.forward_flops for stage in profile.stages) / profile.micro_batch
    ipus = shape.replicas * len(profile.stages)
    device = forward_flops / (ipus * peak_flops(system, shape) * constants.compute_efficiency)
    decode = 1 / (system.host_cores * constants.loader_img_s_per_core)
    return max(device, decode)


def evaluation_s(profile: ModelProfile, system: System, shape: RunShape, constants: Constants, images: int) -> float:
    """One evaluation of `images`, plus a fixed cost (loading the checkpoint, starting the evaluation program)."""
    return images * eval_image_s(profile, system, shape, constants) + constants.eval_overhead_s


def evaluations(epochs: float, eval_every: int = 4) -> int:
    """MLPerf ResNet-50 evaluates every `eval_every` epochs (4 by default), the last one included."""
    return math.ceil(epochs / eval_every)


def project(
    profile: ModelProfile,
    system: System,
    shape: RunShape,
    constants: Constants,
    *,
    epochs: float,
    train_images: int = 1_281_167,
    eval_images: int = 50_000,
    eval_every: int = 4,
) -> Projection:
    """Throughput, epoch time and MLPerf time-to-train: the epochs back to back, then an evaluation per
    `eval_every` epochs (of saved checkpoints, as Graphcore's v1.1 runs did), then the fixed per-run cost."""
    step = step_time(profile, system, shape, constants)
    throughput = shape.global_batch / step.total_s
    epoch = train_images / throughput
    evaluation = evaluations(epochs, eval_every) * evaluation_s(profile, system, shape, constants, eval_images)
    total = epochs * epoch + evaluation + constants.run_overhead_s
    return Projection(throughput, epoch, evaluation, total / 60, step)


def report(projection: Projection, shape: RunShape, stages: int, epochs: float) -> str:
    """The step-time breakdown and the projected run, as run.mode=project prints them."""
    step = projection.step
    terms = {
        f"compute ({pipeline_cycles(stages, shape.grad_accum)} pipeline cycles)": step.compute_s,
        "exchange between stages": step.exchange_s,
        "all-reduce within POD64s (IPU-Links)": step.allreduce_s,
        "all-reduce across POD64s (gateways)": step.gateway_s,
        "weight update": step.update_s,
        f"system syncs ({SYNCS_PER_UPDATE} per update)": step.sync_s,
        f"host sync (1 per {shape.device_iterations} steps)": step.host_sync_s,
    }
    batch = f"{shape.micro_batch} x {shape.grad_accum} x {shape.replicas} replicas = {shape.global_batch} images"
    lines = [f"step time of one weight update ({batch}), ms"]
    lines += [f"  {name:<40}{1e3 * seconds:>10.3f}" for name, seconds in terms.items()]
    lines.append(f"  {'device, total':<40}{1e3 * step.device_s:>10.3f}")
    lines.append(f"  {'host feed (decode and send, overlapped)':<40}{1e3 * step.host_feed_s:>10.3f}")
    bound = "device" if step.device_s >= step.host_feed_s else "host feed"
    lines += [
        f"throughput {projection.throughput_img_s:,.0f} img/s ({bound}-bound)",
        f"epoch {projection.epoch_s:.2f} s",
        f"evaluations {projection.eval_s:.1f} s",
        f"time to train ({epochs:g} epochs) {projection.time_to_train_min:.3f} min",
    ]
    return "\n".join(lines)
