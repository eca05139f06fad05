"""IPU chips and systems as data, and a simulated IPU system's device section.

The chips' and systems' values live in configs/device/ (chip/<name>.yaml and one file per system), with their
sources; these dataclasses are their typed shape (no defaults: a figure comes from the data or nowhere), which the
simulator (simulator.py) and the models that time it (cost.py, memory.py) read. Rates are per second, sizes in bytes.

The section (configs/device/ipu_pod*.yaml, bow_pod*.yaml) holds the system, and how a run is laid out on it, in the
names of Graphcore's PopTorch documentation. Its steps run on the host, so the native speed options that apply there
apply to it too. The layout rules are stated once here: the config's check names the key, the simulated backend
(built directly, as tests do) raises ValueError with the same words."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from configs.checks import ConfigError, one_of, positive, require
from configs.device.native import NativeConfig
from configs.shape import BatchShape

OPTIMIZER_STATES = ("on_chip", "streaming")  # where a run keeps optimizer state: in SRAM, or in streaming memory
MLPERF_ROUNDS = ("v1.1", "v2.0")  # whose Graphcore train.py runs around the steps (cost.py ROUNDS)


@dataclass
class Chip:
    name: str
    tiles: int
    clock_hz: float
    fp16_flops: float  # peak FLOP/s, fp16 in with fp16/fp32 accumulation
    fp32_flops: float
    sram_bytes: float  # In-Processor-Memory per IPU
    sram_bandwidth: float  # bytes/s within the IPU
    link_bandwidth: float  # bytes/s over the IPU's IPU-Links, all links together
    streaming_memory_bytes: float  # off-chip DDR per IPU
    streaming_bandwidth: float  # bytes/s between the IPU and its streaming memory
    host_link_bandwidth: float  # bytes/s from the host, per IPU
    ipus_per_machine: int  # IPUs in one IPU-M2000 or Bow-2000, sharing its IPU-Gateway
    gateway_bandwidth: float  # bytes/s of one machine's GW-Links to other POD64s, shared by its IPUs
    ipus_per_pod: int  # IPUs that IPU-Links join (a POD64); larger systems join POD64s through the gateways


@dataclass
class System:
    name: str
    chip: Chip
    ipus: int
    hosts: int
    host_cores: int  # CPU cores over all hosts, feeding the loader
    mlperf_round: str  # one of MLPERF_ROUNDS: v1.1 (IPU-POD) or v2.0 (Bow Pod)


SPLIT_CHOICES = ("auto", "list")  # device.pipeline_splits' words, besides a list of module names
PIPELINE_MODES = ("pipelined", "sharded")  # how the stages of a model cut over several IPUs take turns


@dataclass
class IpuSimConfig(NativeConfig):
    system: System | None = None  # the simulated IPU system (configs/device/<system>.yaml)
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

    schema: ClassVar[str] = "ipu_sim"
    needs: ClassVar[str] = "a system: device=ipu_pod16, ipu_pod64, ..."
    simulated: ClassVar[bool] = True
    projected: ClassVar[bool] = True
    family: ClassVar[str] = "projection.ipu.family.FAMILY"
    dealt_to: ClassVar[str] = "replicas"

    @property
    def chosen_system(self) -> System:
        """The simulated system (validation has made sure the config names one)."""
        assert self.system is not None
        return self.system

    def validate(self, bn_group_size: int, shape: BatchShape) -> None:
        """The simulated IPU run's layout must fit its system."""
        super().validate(bn_group_size, shape)
        if self.system is None:
            raise ConfigError("device", f"{self.name} needs {self.needs}")
        require(not self.compile, "device.compile", "a simulated IPU runs eager: compile is for device=cpu or cuda")
        require(
            not self.cuda_graphs, "device.cuda_graphs", "a simulated IPU runs eager: CUDA graphs are for device=cuda"
        )
        require(self.replicas >= 1, "device.replicas", f"must be 1 or more, got {self.replicas}")
        self.validate_splits()
        require(
            self.replicas % shape.ranks == 0,
            "device.replicas",
            f"{self.replicas} replicas do not spread evenly over {shape.ranks} ranks",
        )
        one_of(self.pipeline_mode, "device.pipeline_mode", PIPELINE_MODES)
        stages = self.pipeline_stages()
        short = pipeline_short_of_micro_batches(stages, shape.grad_accum, sharded=self.pipeline_mode == "sharded")
        require(short is None, "dist.grad_accum", str(short))
        system = self.system
        require(
            self.replicas * stages <= system.ipus,
            "device.replicas",
            f"{self.replicas} replicas x {stages} IPUs each need more than the {system.ipus} IPUs of {system.name}",
        )
        misfit = bn_groups_misfit(bn_group_size, self.replicas // shape.ranks)
        require(misfit is None, "dist.bn_group_size", str(misfit))
        if self.device_iterations is not None:
            positive(self.device_iterations, "device.device_iterations")
        one_of(self.optimizer_state, "device.optimizer_state", OPTIMIZER_STATES)
        one_of(system.mlperf_round, "device.system.mlperf_round", MLPERF_ROUNDS)

    def validate_splits(self) -> None:
        splits = self.pipeline_splits
        if isinstance(splits, str):
            one_of(splits, "device.pipeline_splits", SPLIT_CHOICES)
        else:
            names = isinstance(splits, list) and all(isinstance(name, str) for name in splits)
            message = f"expects module names such as [layer2,layer3], auto or list, got {splits}"
            require(names, "device.pipeline_splits", message)
        if self.ipus_per_replica is not None:
            positive(self.ipus_per_replica, "device.ipus_per_replica")

    def explicit_splits(self) -> list[str] | None:
        """The module names device.pipeline_splits gives; None where it says "auto" or "list"."""
        return None if isinstance(self.pipeline_splits, str) else list(self.pipeline_splits)

    def pipeline_stages(self) -> int:
        """IPUs per replica: one more than the splits given, or device.ipus_per_replica, or the system's IPUs
        shared by the replicas."""
        splits = self.explicit_splits()
        if splits is not None:
            return len(splits) + 1
        if self.ipus_per_replica is not None:
            return self.ipus_per_replica
        return max(1, self.chosen_system.ipus // self.replicas)

    def replica_count(self, world_size: int) -> int:
        return self.replicas

    def device_time_platform(self) -> str | None:
        return f"{self.chosen_system.name} simulated by rn50perf ipu_sim (device time)"

    def accelerator_fields(self) -> dict[str, str]:
        system = self.chosen_system
        chip = system.chip
        return {
            "number_of_nodes": str(system.hosts),
            "accelerators_per_node": str(system.ipus // system.hosts),
            "accelerator_model_name": f"simulated {system.name} ({chip.name} IPU)",
            "accelerator_frequency": f"{chip.clock_hz / 1e6:.0f} MHz",
            "accelerator_on-chip_memories": f"{chip.sram_bytes / 1e6:.0f} MB In-Processor-Memory",
            "accelerator_memory_capacity": f"{chip.streaming_memory_bytes / 1e9:.0f} GB streaming memory",
            "hw_notes": "accelerators simulated by rn50perf's ipu_sim backend; host fields describe the machine that "
            "ran the simulation",
        }

    def imagenet_experiments(self) -> list[str]:
        """Graphcore's recipe for the system, or for a Bow system of its size (experiment=mlperf_bow_pod256 on
        ipu_pod256, which keeps device=ipu_pod256)."""
        system = self.chosen_system
        return [f"mlperf_{system.name.removeprefix('ipu_')}", f"mlperf_bow_pod{system.ipus}"]


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
