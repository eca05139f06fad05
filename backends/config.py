"""The device section of a run's configuration: where its steps execute (backends/build.py picks the backend by
`device.name`), the native devices' speed options, and a simulated IPU run's layout on its system, with their
checks. configs/schema.py composes it; this module imports no implementation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from configs.checks import ConfigError, one_of, positive, require
from configs.shape import BatchShape
from hardware.gpu import Cluster
from hardware.ipu import MLPERF_ROUNDS, OPTIMIZER_STATES, System

EXECUTING = ("cpu", "cuda", "ipu_sim")  # what backends.build.BACKENDS dispatches on; ipu_sim: a simulated IPU system
# and gpu_cluster: GPU nodes that run.mode=project projects a run onto (configs/device/dgx_*.yaml, pcie_l40s.yaml)
DEVICES = (*EXECUTING, "gpu_cluster")


@dataclass
class DeviceConfig:
    name: str = "cpu"  # cpu | cuda | ipu_sim | gpu_cluster
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    channels_last: bool = True  # NHWC activations: the step 1.36x on an H200 (docs/gpu.md); not measured on a CPU
    foreach: bool | None = None  # the optimizer step as multi-tensor ops over all parameters; None: on CUDA only
    # native 16-bit compute: BatchNorm takes the 16-bit activations as they are (statistics and weights in fp32
    # inside its kernel) instead of a copy cast to fp32 first; None: on CUDA only
    bn_16bit_input: bool | None = None
    compile: bool = False  # torch.compile the model (its forward and backward; the first steps compile)
    pad_input_channels: bool = False  # the first convolution over 4 channels, a zero one added (cuDNN's fp16)
    cuda_graphs: bool = False  # the train step captured once in a CUDA graph and replayed (where it can be)
    system: System | None = None  # ipu_sim: the simulated IPU system (configs/device/<system>.yaml)
    # ipu_sim only: how a run is laid out on the system (the names of Graphcore's PopTorch documentation)
    replicas: int = 1  # data-parallel copies of the model, over all ranks (each rank runs its share)
    # module names that begin pipeline stages 2, 3, ...; "auto": the simulator chooses them for ipus_per_replica
    # stages; "list": print the candidate cuts and exit. Any: OmegaConf has no union of a list and a string
    pipeline_splits: Any = field(default_factory=list)
    ipus_per_replica: int | None = None  # pipeline_splits=auto: stages per replica; None: the system's IPUs over
    # the replicas
    pipeline_mode: str = "pipelined"  # pipelined: the stages work on different micro-batches at once; sharded: one
    # stage at a time, each micro-batch through all of them before the next
    device_iterations: int | None = None  # weight updates per host round trip; None: 5 round trips an epoch, as
    # Graphcore's MLPerf train.py (one per log interval)
    recompute: str = "none"  # none | auto | module names whose outputs are checkpoints, comma-separated
    optimizer_state: str = "on_chip"  # on_chip | streaming (off-chip DDR)
    input_8bit: bool = True  # images cross the host link as uint8 and are normalised on the device
    cluster: Cluster | None = None  # gpu_cluster: the nodes' GPUs and fabric (configs/device/<cluster>.yaml)
    nodes: int = 1  # gpu_cluster: nodes in the cluster
    gpus_per_node: int = 1  # gpu_cluster: GPUs used on each node, one data-parallel replica each
    measured: str | None = None  # gpu_cluster: a gpu.json from make gpu-check, whose step on one GPU replaces the
    # modelled compute: the projection of rn50perf itself on the cluster


SPLIT_CHOICES = ("auto", "list")  # device.pipeline_splits' words, besides a list of module names
PIPELINE_MODES = ("pipelined", "sharded")  # how the stages of a model cut over several IPUs take turns


def explicit_splits(device: DeviceConfig) -> list[str] | None:
    """The module names device.pipeline_splits gives; None where it says "auto" or "list"."""
    return None if isinstance(device.pipeline_splits, str) else list(device.pipeline_splits)


def pipeline_stages(device: DeviceConfig) -> int:
    """IPUs per replica: one more than the splits given, or device.ipus_per_replica, or the system's IPUs shared
    by the replicas."""
    splits = explicit_splits(device)
    if splits is not None:
        return len(splits) + 1
    if device.ipus_per_replica is not None:
        return device.ipus_per_replica
    assert device.system is not None
    return max(1, device.system.ipus // device.replicas)


def validate_splits(device: DeviceConfig) -> None:
    splits = device.pipeline_splits
    if isinstance(splits, str):
        one_of(splits, "device.pipeline_splits", SPLIT_CHOICES)
    else:
        names = isinstance(splits, list) and all(isinstance(name, str) for name in splits)
        require(
            names, "device.pipeline_splits", f"expects module names such as [layer2,layer3], auto or list, got {splits}"
        )
    if device.ipus_per_replica is not None:
        positive(device.ipus_per_replica, "device.ipus_per_replica")


def simulated(device: DeviceConfig) -> bool:
    """Whether the run's steps execute on a simulated IPU system (configs/device/ipu_*.yaml)."""
    return device.name == "ipu_sim"


def gpu_cluster(device: DeviceConfig) -> bool:
    """Whether the device is a GPU cluster that only run.mode=project projects onto (configs/device/dgx_*.yaml)."""
    return device.name == "gpu_cluster"


def replicas(device: DeviceConfig, world_size: int) -> int:
    """Data-parallel replicas: a simulated IPU system's, a GPU cluster's GPUs, or else one per rank."""
    if simulated(device):
        return device.replicas
    if gpu_cluster(device):
        return device.nodes * device.gpus_per_node
    return world_size


def validate_device(device: DeviceConfig, bn_group_size: int, shape: BatchShape) -> None:
    one_of(device.name, "device.name", DEVICES)
    require(device.threads >= 0, "device.threads", f"must be 0 (default) or more, got {device.threads}")
    if simulated(device):
        validate_ipu(device, bn_group_size, shape)
    if gpu_cluster(device):
        validate_cluster(device)
    else:
        for key, value, unset in (("nodes", device.nodes, 1), ("gpus_per_node", device.gpus_per_node, 1)):
            require(value == unset, f"device.{key}", "lays out a GPU cluster to project: device=dgx_h100, ...")
        require(device.measured is None, "device.measured", "projects onto a GPU cluster: device=dgx_h100, ...")


def validate_cluster(device: DeviceConfig) -> None:
    """A GPU cluster needs its nodes described, and at most as many GPUs used per node as a node has."""
    cluster = device.cluster
    if cluster is None:
        raise ConfigError("device", "gpu_cluster needs a cluster: device=dgx_a100, dgx_h100, dgx_h200 or pcie_l40s")
    positive(device.nodes, "device.nodes")
    require(
        1 <= device.gpus_per_node <= cluster.max_gpus_per_node,
        "device.gpus_per_node",
        f"must be 1 to the {cluster.max_gpus_per_node} GPUs of a {cluster.name} node, got {device.gpus_per_node}",
    )


def validate_ipu(device: DeviceConfig, bn_group_size: int, shape: BatchShape) -> None:
    """The simulated IPU run's layout must fit its system."""
    system = device.system
    if system is None:
        raise ConfigError("device", "ipu_sim needs a system: device=ipu_pod16, ipu_pod64, ...")
    require(not device.compile, "device.compile", "a simulated IPU runs eager: compile is for device=cpu or cuda")
    require(not device.cuda_graphs, "device.cuda_graphs", "a simulated IPU runs eager: CUDA graphs are for device=cuda")
    require(device.replicas >= 1, "device.replicas", f"must be 1 or more, got {device.replicas}")
    validate_splits(device)
    require(
        device.replicas % shape.ranks == 0,
        "device.replicas",
        f"{device.replicas} replicas do not spread evenly over {shape.ranks} ranks",
    )
    one_of(device.pipeline_mode, "device.pipeline_mode", PIPELINE_MODES)
    stages = pipeline_stages(device)
    short = pipeline_short_of_micro_batches(stages, shape.grad_accum, sharded=device.pipeline_mode == "sharded")
    require(short is None, "dist.grad_accum", str(short))
    require(
        device.replicas * stages <= system.ipus,
        "device.replicas",
        f"{device.replicas} replicas x {stages} IPUs each need more than the {system.ipus} IPUs of {system.name}",
    )
    misfit = bn_groups_misfit(bn_group_size, device.replicas // shape.ranks)
    require(misfit is None, "dist.bn_group_size", str(misfit))
    if device.device_iterations is not None:
        positive(device.device_iterations, "device.device_iterations")
    one_of(device.optimizer_state, "device.optimizer_state", OPTIMIZER_STATES)
    one_of(system.mlperf_round, "device.system.mlperf_round", MLPERF_ROUNDS)


# The simulated IPU's layout rules, each stated once: the config's check names the key, the backend (built directly,
# as tests do) raises ValueError with the same words.


def pipeline_short_of_micro_batches(stages: int, grad_accum: int, sharded: bool = False) -> str | None:
    """Why a pipeline of `stages` cannot run `grad_accum` micro-batches per update (each stage needs one in flight;
    sharded, one stage at a time, any number will do)."""
    if stages == 1 or grad_accum >= stages or sharded:
        return None
    return f"a pipeline of {stages} stages needs at least {stages} micro-batches per update, got {grad_accum}"


def bn_groups_misfit(bn_group: int, replicas: int) -> str | None:
    """Why BatchNorm groups of `bn_group` replicas do not divide a rank's `replicas`."""
    if bn_group >= 1 and replicas % bn_group == 0:
        return None
    return f"BatchNorm groups of {bn_group} replicas must divide the {replicas} replicas of a rank"
