"""How long a step, an epoch and a whole MLPerf run take on a GPU cluster.

Every GPU holds one data-parallel replica and takes `batch` images a step, as NVIDIA's MLPerf ResNet-50 runs do
(mlcommons/training_results_v2.1 and v3.0, NVIDIA/benchmarks/resnet/implementations/mxnet*: one process per GPU,
Horovod over NCCL). A step is, one after another:
  compute     a fixed floor (kernel latencies and tails, paid whatever the batch) plus, per image, the model's
              FLOPs at a fraction of the tensor-core peak and the memory traffic fused kernels still make at the
              memory bandwidth: the efficiency curve over batch size (small batches sit closer to the floor);
  all-reduce  the fp16 gradients in one message (HOROVOD_FUSION_THRESHOLD 64 MB > 51 MB, MXNET_HOROVOD_NUM_GROUPS=1,
              "no NCCL and BWD overlap" in the configs), by NCCL: within a node over NVLink (or PCIe), across
              nodes each GPU's shard over its own InfiniBand rail, by ring or tree, or reduced in the switches;
  optimizer   LARS over every parameter (its fp32 master weights and momentum read and written);
  straggler   the wait for the slowest GPU: the all-reduce holds every GPU until the last one's gradients are in,
              and host noise delays each GPU's step by a random amount, so the step is the slowest of N;
and the host's decoding, which overlaps them, binds only where it is slower. Around the steps a run trains its
epochs in blocks that end in an evaluation on all GPUs, the first epochs slower while everything warms up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from projection.gpu.config import Cluster
from projection.profile import ModelProfile
from projection.run import Schedule


@dataclass(frozen=True)
class Constants:
    """The free constants. Five are fitted, and the warm-up's centre, by `python -m projection.gpu.calibrate` to
    the in-sample systems' steady epochs, evaluations and times to train; the rest are measured in their logs or
    assumed, each with its range and reason in ASSUMPTIONS (projection/gpu/calibrate.py)."""

    compute_efficiency: float = 0.6024  # fraction of the tensor-core peak the model's FLOPs reach; fitted
    traffic_fraction: float = 0.5797  # of the probe's unfused memory traffic, what fused kernels still move; fitted
    step_floor_s: float = 3.115e-3  # per step whatever the batch, on a GPU clocked as the H100: kernel latencies and
    # tails; fitted
    floor_clock_exponent: float = 0.5  # the floor scales as (H100's clock / the GPU's) ** this: 0 if host-bound
    # (launches, syncs), 1 if every latency is GPU cycles
    eval_image_factor: float = 1.608  # an evaluated image's time over a training forward pass's; fitted
    eval_overhead_s: float = 4.271e-3  # per evaluation beyond its images and reductions; fitted
    nvlink_efficiency: float = 0.8  # NCCL's bus bandwidth over the NVLink line rate
    pcie_efficiency: float = 0.6  # NCCL's bus bandwidth over the PCIe line rate, where GPUs meet over PCIe only
    nvlink_latency_s: float = 3e-6  # per ring step within a node
    fabric_efficiency: float = 0.8  # NCCL's bus bandwidth over the InfiniBand line rate
    fabric_latency_s: float = 8e-6  # per ring or tree step between nodes, or per switch level reducing in-network
    step_jitter_s: float = 10e-6  # a GPU's mean delay a step from host noise (exponential tail): the straggler
    loader_img_s_per_core: float = 1000.0  # a host core's share of decoding (DALI with nvJPEG, hardware decoders)
    start_s: float = 0.8  # run_start to the first step
    warmup_epochs: float = 0.9017  # the first epochs' warm-up beyond steady ones, in epochs; its centre fitted
    first_eval_extra_s: float = 0.294  # the first evaluation over a later one


@dataclass(frozen=True)
class Layout:
    """How a run lays out on the cluster: `nodes` x `gpus_per_node` replicas of `batch` images each."""

    nodes: int
    gpus_per_node: int
    batch: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def global_batch(self) -> int:
        return self.gpus * self.batch


@dataclass(frozen=True)
class MeasuredStep:
    """A step measured on one GPU (make gpu-check's gpu.json): `img_s` at `batch` images, on `gpu`."""

    gpu: str
    batch: int
    img_s: float
    source: str


@dataclass(frozen=True)
class StepTime:
    """One step, by component (seconds). The device terms add up; the host feed overlaps them."""

    compute_s: float
    allreduce_node_s: float  # within each node, over NVLink (or PCIe)
    allreduce_fabric_s: float  # across nodes, over InfiniBand (0 on one node)
    optimizer_s: float
    straggler_s: float  # waiting for the slowest GPU beyond a GPU's mean step
    host_feed_s: float  # each node's hosts decoding its GPUs' images, overlapped

    @property
    def device_s(self) -> float:
        return self.compute_s + self.allreduce_node_s + self.allreduce_fabric_s + self.optimizer_s + self.straggler_s

    @property
    def total_s(self) -> float:
        return max(self.device_s, self.host_feed_s)


@dataclass(frozen=True)
class Projection:
    throughput_img_s: float  # as MLPerf's logs give it: a steady block of epochs and its evaluation
    epoch_s: float  # a steady epoch
    evaluation_s: float  # one steady evaluation
    evaluations: int
    time_to_train_min: float
    step: StepTime
    fabric_algorithm: str  # how the gradients cross nodes: "none", "ring", "tree" or "in-network"


OPTIMIZER_BYTES_PER_PARAM = 24  # fp16 gradient read; fp32 weight read twice (norm, update) and written; fp32
# momentum read and written; the fp16 weight copy written
GRADIENT_BYTES = 2  # fp16 gradients, as NVIDIA's runs reduce them
IN_NETWORK_FROM_NODES = 9  # NVIDIA's configs reduce in the switches (SBATCH_NETWORK=sharp) at 64 nodes and more,
# never at 8 or fewer
SWITCH_RADIX = 32  # nodes one leaf switch of a fat tree reaches (64-port Quantum: 32 down, 32 up)


def image_work(profile: ModelProfile, forward_only: bool = False) -> tuple[float, float]:
    """One image's FLOPs and the memory traffic the probe counts for it unfused (the forward's share of it for an
    evaluation: a third, as for the FLOPs)."""
    stage = profile.stages[0]
    training_flops = stage.forward_flops + stage.backward_flops
    flops = stage.forward_flops if forward_only else training_flops
    traffic = stage.memory_bytes * flops / training_flops
    return flops / profile.micro_batch, traffic / profile.micro_batch


def image_s(profile: ModelProfile, cluster: Cluster, constants: Constants, forward_only: bool = False) -> float:
    """One image through the model on one GPU, beyond the floor: its FLOPs at the reached fraction of the tensor
    peak, then the traffic fused kernels leave at the memory bandwidth (convolutions are compute-bound, the
    normalisations and activations between them memory-bound, and they run one after another)."""
    flops, traffic = image_work(profile, forward_only)
    gpu = cluster.gpu
    return flops / (gpu.fp16_flops * constants.compute_efficiency) + traffic * constants.traffic_fraction / (
        gpu.memory_bandwidth
    )


REFERENCE_CLOCK_HZ = 1.98e9  # the H100 SXM's boost clock, at which step_floor_s is given


def floor_s(cluster: Cluster, constants: Constants) -> float:
    """The step's floor on this GPU: kernel latencies and tails, partly in GPU cycles."""
    slower: float = (REFERENCE_CLOCK_HZ / cluster.gpu.clock_hz) ** constants.floor_clock_exponent
    return constants.step_floor_s * slower


def compute_s(
    profile: ModelProfile, cluster: Cluster, batch: int, constants: Constants, measured: MeasuredStep | None
) -> float:
    """The floor plus `batch` images. A measured step replaces the modelled per-image time by its own: what its
    step took beyond the floor and the optimizer, over its images."""
    floor = floor_s(cluster, constants)
    if measured is None:
        return floor + batch * image_s(profile, cluster, constants)
    beyond = measured.batch / measured.img_s - floor - optimizer_s(profile, cluster)
    return floor + batch * beyond / measured.batch


def ring_s(nbytes: float, ranks: int, bandwidth: float, latency_s: float) -> float:
    """Ring all-reduce: a reduce-scatter and an all-gather, each rank sending 2 (n - 1) / n of the data in
    2 (n - 1) steps."""
    steps = 2 * (ranks - 1)
    return steps / ranks * nbytes / bandwidth + steps * latency_s


def node_bandwidth(cluster: Cluster, constants: Constants) -> float:
    """What one GPU reaches to its node's others: NVLink through NVSwitch, or, where there is none, PCIe, which NCCL
    drives further below its line rate (between GPUs on the CPU's root ports it stages every byte in host memory)."""
    if cluster.gpu.nvlink_bandwidth:
        return cluster.gpu.nvlink_bandwidth * constants.nvlink_efficiency
    return cluster.gpu.pcie_bandwidth * constants.pcie_efficiency


def node_ring_s(nbytes: float, cluster: Cluster, layout: Layout, constants: Constants) -> float:
    """Within each node, one ring's worth of `nbytes`: the whole all-reduce on one node; on several, the
    reduce-scatter before the fabric phase and the all-gather after it."""
    bandwidth = node_bandwidth(cluster, constants)
    return ring_s(nbytes, layout.gpus_per_node, bandwidth, constants.nvlink_latency_s)


def allreduce_node_s(profile: ModelProfile, cluster: Cluster, layout: Layout, constants: Constants) -> float:
    """The gradients' all-reduce within each node."""
    return node_ring_s(profile.param_count * GRADIENT_BYTES, cluster, layout, constants)


def fabric_algorithms(cluster: Cluster, layout: Layout, constants: Constants, shard: float) -> dict[str, float]:
    """Each way NCCL could all-reduce a GPU's shard across the nodes over its rail, and its time: the ring, the
    tree (log-depth latency, about the ring's bandwidth), and, where the switches can and the run is as large as
    NVIDIA's that did, in-network reduction (each byte crosses the rail once each way; one latency per level)."""
    nodes, bandwidth = layout.nodes, cluster.fabric_bandwidth * constants.fabric_efficiency
    times = {
        "ring": ring_s(shard, nodes, bandwidth, constants.fabric_latency_s),
        "tree": 2 * shard / bandwidth + 2 * math.ceil(math.log2(nodes)) * constants.fabric_latency_s,
    }
    if cluster.in_network_reduction and nodes >= IN_NETWORK_FROM_NODES:
        levels = math.ceil(math.log(nodes, SWITCH_RADIX))
        times["in-network"] = shard / bandwidth + 2 * levels * constants.fabric_latency_s
    return times


def fastest_across_nodes(cluster: Cluster, layout: Layout, constants: Constants, shard: float) -> tuple[str, float]:
    """The fastest way to all-reduce a GPU's `shard` across the nodes (NCCL's tuner picks by its own model of the same
    terms): ("none", 0) on one node."""
    if layout.nodes == 1:
        return "none", 0.0
    times = fabric_algorithms(cluster, layout, constants, shard)
    fastest = min(times, key=times.__getitem__)
    return fastest, times[fastest]


def allreduce_fabric(
    profile: ModelProfile, cluster: Cluster, layout: Layout, constants: Constants
) -> tuple[str, float]:
    """How the gradients cross the nodes, and the time: each GPU's shard after the reduce-scatter within its node."""
    shard = profile.param_count * GRADIENT_BYTES / layout.gpus_per_node
    return fastest_across_nodes(cluster, layout, constants, shard)


def reduction_s(cluster: Cluster, layout: Layout, constants: Constants) -> float:
    """An all-reduce over every GPU of a few numbers (an evaluation's BatchNorm statistics, its counts of correct
    images): latency alone, the fastest way's steps within and across the nodes."""
    return node_ring_s(0.0, cluster, layout, constants) + fastest_across_nodes(cluster, layout, constants, 0.0)[1]


@cache
def slowest_of(gpus: int) -> float:
    """The expected wait for the slowest of `gpus` independent, exponentially distributed delays, beyond one GPU's
    mean delay, in means: the harmonic number H(n) - 1, about ln n - 0.42."""
    return sum(1 / k for k in range(2, gpus + 1))


def straggler_s(layout: Layout, constants: Constants) -> float:
    """What a step waits for its slowest GPU beyond one GPU's mean delay. Host noise (interrupts, daemons, the
    framework's and the loader's threads) delays each GPU's step by a random amount, mean `step_jitter_s`; the
    all-reduce that ends the step waits for the last GPU. An exponential tail (rare, long delays) makes the wait
    grow as ln N: Petrini et al., "The Case of the Missing Supercomputer Performance" (SC 2003); Hoefler et al.,
    "Characterizing the Influence of System Noise on Large-Scale Applications by Simulation" (SC 2010)."""
    return constants.step_jitter_s * slowest_of(layout.gpus)


def optimizer_s(profile: ModelProfile, cluster: Cluster) -> float:
    """LARS over every parameter at the memory bandwidth, as one fused multi-tensor kernel."""
    return profile.param_count * OPTIMIZER_BYTES_PER_PARAM / cluster.gpu.memory_bandwidth


def host_feed_s(cluster: Cluster, layout: Layout, constants: Constants) -> float:
    """A node's host cores decoding its GPUs' images for one step."""
    return layout.gpus_per_node * layout.batch / (cluster.host_cores * constants.loader_img_s_per_core)


def step_time(
    profile: ModelProfile,
    cluster: Cluster,
    layout: Layout,
    constants: Constants,
    measured: MeasuredStep | None = None,
) -> tuple[StepTime, str]:
    """One step on every GPU at once, and how its gradients crossed the nodes."""
    algorithm, fabric = allreduce_fabric(profile, cluster, layout, constants)
    step = StepTime(
        compute_s=compute_s(profile, cluster, layout.batch, constants, measured),
        allreduce_node_s=allreduce_node_s(profile, cluster, layout, constants),
        allreduce_fabric_s=fabric,
        optimizer_s=optimizer_s(profile, cluster),
        straggler_s=straggler_s(layout, constants),
        host_feed_s=host_feed_s(cluster, layout, constants),
    )
    return step, algorithm


def eval_images_per_gpu(layout: Layout, schedule: Schedule) -> int:
    """The validation images each GPU computes: its shard of them in whole batches of the training batch, the last
    padded with repeats (NVIDIA's validation pipeline: mlcommons/training_results_v3.0,
    NVIDIA/benchmarks/resnet/implementations/mxnet/common/dali.py, HybridValPipe at the training batch,
    last_batch_padded)."""
    shard = math.ceil(schedule.eval_images / layout.gpus)
    return math.ceil(shard / layout.batch) * layout.batch


def evaluation_s(
    profile: ModelProfile, cluster: Cluster, layout: Layout, constants: Constants, schedule: Schedule
) -> float:
    """One evaluation: each GPU's padded shard of the validation images, each at `eval_image_factor` times a training
    forward pass (the evaluation runs outside the training step's CUDA graph, on its own pipeline), a fixed cost
    (the switch to evaluation and back), and two reductions over every GPU (the same implementation's
    common/fit.py: the BatchNorm running statistics before, the counts of correct images after)."""
    forward = image_s(profile, cluster, constants, forward_only=True)
    images = eval_images_per_gpu(layout, schedule) * constants.eval_image_factor * forward
    return constants.eval_overhead_s + 2 * reduction_s(cluster, layout, constants) + images


def project(
    profile: ModelProfile,
    cluster: Cluster,
    layout: Layout,
    constants: Constants,
    schedule: Schedule,
    measured: MeasuredStep | None = None,
) -> Projection:
    """Throughput as MLPerf's logs give it (a steady block: `eval_every` epochs and their evaluation), and the time
    to train: the start, every epoch (the first ones slower by `warmup_epochs`), every evaluation."""
    step, algorithm = step_time(profile, cluster, layout, constants, measured)
    epoch = schedule.train_images / layout.global_batch * step.total_s
    evaluation = evaluation_s(profile, cluster, layout, constants, schedule)
    block = schedule.eval_every * epoch + evaluation
    evaluations = len(schedule.eval_epochs())
    training = (schedule.epochs + constants.warmup_epochs) * epoch
    seconds = constants.start_s + training + evaluations * evaluation + constants.first_eval_extra_s
    return Projection(
        throughput_img_s=schedule.eval_every * schedule.train_images / block,
        epoch_s=epoch,
        evaluation_s=evaluation,
        evaluations=evaluations,
        time_to_train_min=seconds / 60,
        step=step,
        fabric_algorithm=algorithm,
    )
