"""How long a step, an epoch and a whole MLPerf run take on a TPU slice.

Every replica (a TensorCore, or a chip whose two TensorCores run as one megacore) takes `replica_batch` images a
step, as Google's MLPerf ResNet-50 runs did (mlcommons/training_results_v0.6 to v1.0, Google/benchmarks/resnet/
implementations/tpu-*: TPUEstimator or its v1.0 successor, bf16 activations, fp32 variables). A step is, one after
another:
  MXU          the model's FLOPs at the MXUs' peak times a fitted efficiency, which falls with the replica's
               batch as the MXUs' rows go unfilled: a convolution over b images of P output pixels is a matrix
               product of b P rows, fed to the MXU in whole tiles of its size (128 or 256 rows), the last padded;
  memory       the traffic the compiler's fusions still make (BatchNorm, elementwise work) at HBM bandwidth;
  BatchNorm    each BatchNorm layer's statistics (forward) and their gradients (backward) summed over the
               `bn_group` replicas of a group (`cross_replica_sum` over `distributed_group_size`): latency-bound;
  all-reduce   the fp32 gradients summed over the torus, one reduction per dimension: a ring both ways along
               each dimension in turn, on what the ones before left each chip, a chunk of the gradients starting
               in each dimension so that every link carries one; each ring step pays a
               hop's latency, once for the merged gradients, or once per gradient tensor where a run reduces
               them one by one (the v0.6 runs behave so);
  optimizer    LARS over the weights: each gradient tensor's norms and update as small operations, each at a
               fixed cost, and the bytes at HBM bandwidth; or, sharded, each replica's share of the tensors and
               bytes after a reduce-scatter and before an all-gather (the same bytes over the torus as the
               all-reduce), as Google's v1.0 run did and wherever that is faster;
and each host's input pipeline, which overlaps them, binds only where it is slower: it decodes JPEGs in the first
epoch and feeds its cached decoded images (crops and flips) after it. Around the steps, the host calls the device
once per `steps_per_call` steps; the run evaluates on the training chips every few epochs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from projection.profile import ModelProfile
from projection.run import Schedule
from projection.tpu.config import TpuChip, TpuSliceConfig

GRADIENT_BYTES = 4  # fp32 gradients of fp32 variables, summed as TensorFlow's cross_replica_sum sums them
OPTIMIZER_BYTES_PER_PARAM = 20  # fp32 gradient read; fp32 weight read twice (norm, update) and written; fp32
# momentum read and written
BATCHNORM_LAYERS = 53  # ResNet-50 v1.5's BatchNorm layers, each summed over its group forward and backward
BATCHNORM_SUMS_PER_LAYER = 2  # forward: the batch's sum and sum of squares; backward: the two gradient sums


@dataclass(frozen=True)
class Constants:
    """The free constants, at their fit. Four are fitted by `python -m projection.tpu.calibrate` to the six
    in-sample systems' throughputs, the first epoch's decoding rate and a multipod's start to their times to train;
    the rest are assumed, each with its range and reason in ASSUMPTIONS (projection/tpu/calibrate.py)."""

    mxu_efficiency: float = (
        0.7008  # fraction of the MXUs' peak the model's FLOPs reach where their rows are full; fitted
    )
    traffic_fraction: float = 0.3295  # of the probe's unfused memory traffic, what XLA's fusions still move; fitted
    optimizer_tensor_s: float = 14.61e-6  # LARS's small operations on one gradient tensor (norms, trust ratio,
    # update); fitted
    hop_latency_s: float = 1.316e-6  # one step of a ring between neighbouring chips; fitted
    decode_img_s_per_host: float = 4375.0  # a host's JPEG decoding in the first epoch, before its cache; fitted
    ici_efficiency: float = 0.8  # an all-reduce's bandwidth over the ICI links' line rate
    eval_image_factor: float = 1.0  # an evaluated image's time over a training forward pass's
    cached_img_s_per_host: float = 40_000.0  # a host feeding its cached decoded images (crop, flip, transfer)
    call_s: float = 10e-3  # one host call of the device's training loop
    start_s: float = 1.0  # run_start to the first step
    multipod_start_s: float = 3.833  # what a slice across pods adds to the start; fitted
    uncalibrated_scale: float = 1.0  # the MXU and memory times of a chip no published result calibrates, over the
    # fit's (a range only: the fit never sees such a chip)


@dataclass(frozen=True)
class Layout:
    """How a run lays out on a slice: `replicas` of `replica_batch` images each over `chips` chips in a `torus`,
    `hosts` hosts feeding them, BatchNorm over groups of `bn_group` replicas."""

    chips: int
    replicas: int
    replica_batch: int
    bn_group: int
    torus: tuple[int, ...]
    hosts: int
    cores_per_replica: int
    steps_per_call: int | None = None  # None: one call per block of epochs between evaluations
    reductions: int = 1  # gradient all-reduces a step: 1 merged, or one per gradient tensor
    optimizer_sharded: bool | None = None  # None: sharded wherever that is faster
    pods: int = 1
    calibrated: bool = True  # a published ResNet-50 result calibrates the chip (v3, v4)

    @property
    def global_batch(self) -> int:
        return self.replicas * self.replica_batch

    @property
    def replicas_per_chip(self) -> int:
        return self.replicas // self.chips


def layout_of(device: TpuSliceConfig, global_batch: int, calibrated: bool = True) -> Layout:
    """The layout of a run of `global_batch` images on the section's slice (`calibrated`: its chip by a published
    result)."""
    return Layout(
        chips=device.chips,
        replicas=device.replicas,
        replica_batch=global_batch // device.replicas,
        bn_group=device.bn_group,
        torus=device.torus,
        hosts=device.hosts,
        cores_per_replica=device.cores_per_replica,
        steps_per_call=device.steps_per_call,
        pods=device.pods,
        calibrated=calibrated,
    )


@dataclass(frozen=True)
class StepTime:
    """One step, by component (seconds). The device terms add up; the hosts' feed overlaps them."""

    mxu_s: float
    memory_s: float
    batchnorm_s: float
    allreduce_s: tuple[float, ...]  # one per torus dimension
    optimizer_s: float
    optimizer_sharded: bool
    host_feed_s: float  # each host feeding its chips from its cache, overlapped

    @property
    def device_s(self) -> float:
        return self.mxu_s + self.memory_s + self.batchnorm_s + sum(self.allreduce_s) + self.optimizer_s

    @property
    def total_s(self) -> float:
        return max(self.device_s, self.host_feed_s)


@dataclass(frozen=True)
class DeviceTimes:
    """What a simulated slice's clock moves by: a step, an evaluated image (over the slice) and a host call."""

    step_s: float
    eval_image_s: float
    call_s: float


@dataclass(frozen=True)
class Projection:
    throughput_img_s: float  # as MLPerf's logs give it: a steady block of epochs and its evaluation
    epoch_s: float  # a steady epoch
    evaluation_s: float
    evaluations: int
    first_epoch_extra_s: float  # the first epoch's decoding beyond a steady epoch
    calls: int  # host calls over the run
    time_to_train_min: float
    step: StepTime


def replica_share(chip: TpuChip, layout: Layout) -> float:
    """A replica's share of its chip's MXUs and HBM: all of it for a megacore, a TensorCore's otherwise."""
    return layout.cores_per_replica / chip.tensorcores


def image_work(profile: ModelProfile, forward_only: bool = False) -> tuple[float, float]:
    """One image's FLOPs and the memory traffic the probe counts for it unfused (the forward's share of it for an
    evaluation)."""
    stage = profile.stages[0]
    training_flops = stage.forward_flops + stage.backward_flops
    flops = stage.forward_flops if forward_only else training_flops
    return flops / profile.micro_batch, stage.memory_bytes * flops / training_flops / profile.micro_batch


def row_fill(rows: int, mxu_size: int) -> float:
    """How full the MXU's tiles are for a matrix product of `rows` rows: the last tile padded."""
    return rows / (math.ceil(rows / mxu_size) * mxu_size)


def mxu_fill(profile: ModelProfile, chip: TpuChip, batch: int) -> float:
    """The MXUs' effective fill over the model's matrix products at `batch` images: the FLOPs over the FLOPs
    padded to whole tiles."""
    return 1 / sum(share / row_fill(batch * rows, chip.mxu_size) for rows, share in profile.matmul_rows)


def mxu_s(profile: ModelProfile, chip: TpuChip, layout: Layout, constants: Constants, forward: bool = False) -> float:
    """The replica's FLOPs at the fitted efficiency, its tiles as full as its batch fills them."""
    flops, _ = image_work(profile, forward)
    peak = chip.bf16_flops * replica_share(chip, layout) * constants.mxu_efficiency
    scale = 1.0 if layout.calibrated else constants.uncalibrated_scale
    return scale * layout.replica_batch * flops / (peak * mxu_fill(profile, chip, layout.replica_batch))


def memory_s(
    profile: ModelProfile, chip: TpuChip, layout: Layout, constants: Constants, forward: bool = False
) -> float:
    """The traffic XLA's fusions leave, at the replica's share of HBM bandwidth."""
    _, traffic = image_work(profile, forward)
    bandwidth = chip.hbm_bandwidth * replica_share(chip, layout)
    scale = 1.0 if layout.calibrated else constants.uncalibrated_scale
    return scale * layout.replica_batch * traffic * constants.traffic_fraction / bandwidth


def link_bandwidth(chip: TpuChip, constants: Constants) -> float:
    """What a ring along one torus dimension moves a second each way: two links (one to each neighbour)."""
    return 2 * chip.ici_link_bandwidth * constants.ici_efficiency


def ring_s(nbytes: float, chips: int, bandwidth: float, latency_s: float) -> float:
    """Ring all-reduce of `nbytes` along one dimension of `chips`: each chip sends 2 (n - 1) / n of the data in
    2 (n - 1) steps."""
    if chips == 1:
        return 0.0
    steps = 2 * (chips - 1)
    return steps / chips * nbytes / bandwidth + steps * latency_s


def torus_allreduce_s(
    nbytes: float, chip: TpuChip, layout: Layout, constants: Constants, reductions: int = 1
) -> tuple[float, ...]:
    """The reduction over the torus, one dimension after another: the data split in one chunk per dimension, each
    chunk reduced along the dimensions in its own rotated order, all at once, so that every link carries a chunk
    (the reduce-scatter along one dimension leaves 1/n of its chunk to the next; the all-gathers return in
    reverse). The time is the slowest chunk's, by dimension; `reductions` separate ones share the bytes and each
    pays every ring step's latency."""
    sides, chunk = layout.torus, nbytes / len(layout.torus)
    bandwidth, latency = link_bandwidth(chip, constants), constants.hop_latency_s * reductions
    slowest = [0.0] * len(sides)
    for first in range(len(sides)):
        times, left = [0.0] * len(sides), chunk
        for d in (*range(first, len(sides)), *range(first)):
            times[d] = ring_s(left, sides[d], bandwidth, latency)
            left /= sides[d]
        slowest = max(slowest, times, key=sum)
    return tuple(slowest)


def batchnorm_s(chip: TpuChip, layout: Layout, constants: Constants) -> float:
    """Every BatchNorm layer's sums over its group of replicas, forward and backward: a ring's steps each."""
    if layout.bn_group == 1:
        return 0.0
    chips = max(1, layout.bn_group // layout.replicas_per_chip)  # a group's replicas on one chip meet on-chip
    steps = 2 * (chips - 1) + 1
    return BATCHNORM_LAYERS * BATCHNORM_SUMS_PER_LAYER * steps * constants.hop_latency_s


def optimizer(profile: ModelProfile, chip: TpuChip, layout: Layout, constants: Constants) -> tuple[float, bool]:
    """LARS's time a step, and whether it is sharded: over every tensor on every replica, or each replica's share
    of the tensors (at least one) and of the bytes, as the layout says or, where it does not, the faster."""
    bandwidth = chip.hbm_bandwidth * replica_share(chip, layout)
    tensors, nbytes = profile.gradient_tensors, profile.param_count * OPTIMIZER_BYTES_PER_PARAM
    whole = tensors * constants.optimizer_tensor_s + nbytes / bandwidth
    shard = math.ceil(tensors / layout.replicas) * constants.optimizer_tensor_s + nbytes / layout.replicas / bandwidth
    sharded = shard < whole if layout.optimizer_sharded is None else layout.optimizer_sharded
    return (shard if sharded else whole), sharded


def host_feed_s(chip: TpuChip, layout: Layout, img_s_per_host: float) -> float:
    """A host feeding its chips' images for one step at `img_s_per_host`."""
    chips_per_host = min(layout.chips, chip.chips_per_host)
    return chips_per_host * layout.replicas_per_chip * layout.replica_batch / img_s_per_host


def step_time(profile: ModelProfile, chip: TpuChip, layout: Layout, constants: Constants) -> StepTime:
    """One step on every replica at once."""
    optimizer_s, sharded = optimizer(profile, chip, layout, constants)
    return StepTime(
        mxu_s=mxu_s(profile, chip, layout, constants),
        memory_s=memory_s(profile, chip, layout, constants),
        batchnorm_s=batchnorm_s(chip, layout, constants),
        allreduce_s=torus_allreduce_s(profile.param_count * GRADIENT_BYTES, chip, layout, constants, layout.reductions),
        optimizer_s=optimizer_s,
        optimizer_sharded=sharded,
        host_feed_s=host_feed_s(chip, layout, constants.cached_img_s_per_host),
    )


def eval_steps(layout: Layout, schedule: Schedule) -> int:
    """The evaluation's steps: each replica's shard of the validation images in whole replica batches, the last
    padded (Google's eval input pads the 50,000 images to whole batches)."""
    shard = math.ceil(schedule.eval_images / layout.replicas)
    return math.ceil(shard / layout.replica_batch)


def eval_step_s(profile: ModelProfile, chip: TpuChip, layout: Layout, constants: Constants) -> float:
    """One evaluation step of a replica batch: the forward's MXU and memory time at `eval_image_factor`."""
    forward = mxu_s(profile, chip, layout, constants, True) + memory_s(profile, chip, layout, constants, True)
    return constants.eval_image_factor * forward


def evaluation_s(
    profile: ModelProfile, chip: TpuChip, layout: Layout, constants: Constants, schedule: Schedule
) -> float:
    """One evaluation on the training chips, inside the device's loop: its steps, and the sum of the counts of
    correct images over the torus."""
    counts = sum(torus_allreduce_s(0.0, chip, layout, constants))
    return eval_steps(layout, schedule) * eval_step_s(profile, chip, layout, constants) + counts


def device_times(
    profile: ModelProfile, chip: TpuChip, layout: Layout, constants: Constants = Constants()
) -> DeviceTimes:
    """What a simulated slice's clock moves by (a steady step, an image of an evaluation over the whole slice, and
    a host call)."""
    eval_image_s = eval_step_s(profile, chip, layout, constants) / (layout.replicas * layout.replica_batch)
    return DeviceTimes(step_time(profile, chip, layout, constants).total_s, eval_image_s, constants.call_s)


def steps_per_epoch(layout: Layout, schedule: Schedule) -> int:
    return math.ceil(schedule.train_images / layout.global_batch)


def host_calls(layout: Layout, schedule: Schedule) -> int:
    """The host's calls of the device's loop over the run: one per `steps_per_call` steps within each block of
    epochs, or one per block (its epochs and the evaluation that ends it)."""
    blocks = len(schedule.eval_epochs())
    if layout.steps_per_call is None:
        return blocks
    steps = schedule.epochs * steps_per_epoch(layout, schedule)
    return max(blocks, math.ceil(steps / layout.steps_per_call))


def first_epoch_extra_s(chip: TpuChip, layout: Layout, constants: Constants, steady_step_s: float) -> float:
    """The first epoch beyond a steady one: its hosts decode every JPEG (they cache the decoded images for later
    epochs), which binds where decoding is slower than the device's step."""
    decoding = host_feed_s(chip, layout, constants.decode_img_s_per_host)
    return max(0.0, decoding - steady_step_s)


def project(
    profile: ModelProfile, chip: TpuChip, layout: Layout, constants: Constants, schedule: Schedule
) -> Projection:
    """Throughput as MLPerf's logs give it (a steady block: `eval_every` epochs and their evaluation), and the time
    to train: the start, every epoch (the first at its hosts' decoding), every evaluation, every host call."""
    step = step_time(profile, chip, layout, constants)
    steps = steps_per_epoch(layout, schedule)
    epoch = steps * step.total_s
    evaluation = evaluation_s(profile, chip, layout, constants, schedule)
    block = schedule.eval_every * epoch + evaluation + constants.call_s
    evaluations = len(schedule.eval_epochs())
    first_extra = steps * first_epoch_extra_s(chip, layout, constants, step.total_s)
    calls = host_calls(layout, schedule)
    start = constants.start_s + (constants.multipod_start_s if layout.pods > 1 else 0.0)
    seconds = start + schedule.epochs * epoch + first_extra + evaluations * evaluation
    return Projection(
        throughput_img_s=schedule.eval_every * schedule.train_images / block,
        epoch_s=epoch,
        evaluation_s=evaluation,
        evaluations=evaluations,
        first_epoch_extra_s=first_extra,
        calls=calls,
        time_to_train_min=(seconds + calls * constants.call_s) / 60,
        step=step,
    )
