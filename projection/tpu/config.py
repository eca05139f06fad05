"""Google TPU chips and slices as data, and a TPU slice's device section.

The chips' figures live in configs/device/tpu_<generation>.yaml, each with its public source; `TpuChip` is their
typed shape (no defaults: a figure comes from the data or nowhere). Rates are per second, sizes in bytes, link
bandwidths one direction. A slice is `device.chips` chips joined by their inter-chip interconnect (ICI) in a 2D or 3D
torus; the section says how a run lays out on it, as Google's MLPerf ResNet-50 code did (mlcommons/
training_results_v0.6 to v1.0, Google/benchmarks/resnet/implementations/tpu-*: one replica per TensorCore, or per
chip where a megacore runs its two as one; BatchNorm summed over `distributed_group_size` replicas; the host called
once per `iterations_per_loop` steps). Its steps run on the host, like the simulated IPU's, so the native speed
options that apply there apply to it too."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from typing import ClassVar

from configs.checks import ConfigError, positive, require
from configs.device.native import NativeConfig
from configs.shape import BatchShape, nearest_multiple
from optim.config import PrecisionConfig

REPLICA_BATCH_MULTIPLE = 8  # a TPU's batch per replica: a multiple of 8 fills its MXUs' rows (Google's TPU docs)
CUBE = 64  # chips in a 4x4x4 cube, the unit optical switches join (v4, v5p, v7)
NAMES_COUNT = ("tensorcores", "chips")  # what the number in Google's slice names counts


@dataclass
class TpuChip:
    name: str  # the generation: v2, v3, v4, v5e, v5p, v6e, v7
    bf16_flops: float  # peak bf16 FLOP/s of the chip's MXUs, fp32 accumulation
    tensorcores: int
    megacore: bool  # the chip's TensorCores run as one replica (v4, v5p)
    mxus_per_core: int
    mxu_size: int  # an MXU's rows and columns
    hbm_bytes: float
    hbm_bandwidth: float
    ici_links: int  # inter-chip links per chip
    ici_link_bandwidth: float  # one link, one direction
    torus_dims: int  # 2 or 3
    slices: list[int]  # the slice sizes the generation offers, in chips, ascending (below its cubes, if any)
    cubes_up_to: int  # and any whole number of 4x4x4 cubes up to this many chips (0: no slices of cubes)
    pod_chips: int  # chips in one pod; a larger slice joins pods (v3's multipod)
    chips_per_host: int
    names_count: str  # one of NAMES_COUNT: whether Google's slice names count TensorCores or chips
    name_prefix: str  # the start of Google's slice names ("v4" in v4-128)

    def offered(self) -> list[int]:
        """Every slice size the generation offers, in chips, ascending."""
        return sorted({*self.slices, *range(CUBE, self.cubes_up_to + 1, CUBE)})

    def google_name(self, chips: int) -> str:
        """The slice's name as Google writes it (v4-128 is 64 chips: it counts TensorCores)."""
        count = chips * self.tensorcores if self.names_count == "tensorcores" else chips
        return f"{self.name_prefix}-{count}"


def torus_shape(chips: int, dims: int) -> tuple[int, ...]:
    """The slice's torus, its sides as balanced as the chip count allows, ascending (4096 chips in 3D: 16 x 16 x
    16; 6144: 16 x 16 x 24; 16 in 2D: 4 x 4)."""
    sides = [1] * dims
    for prime in reversed(prime_factors(chips)):
        sides[sides.index(min(sides))] *= prime
    return tuple(sorted(sides))


def prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors + ([n] if n > 1 else [])


def nearest_slice(chips: int, slices: list[int]) -> int:
    """The slice size closest to `chips` (the smaller where two are as close)."""
    i = bisect.bisect_left(slices, chips)
    return min(slices[max(0, i - 1) : i + 1], key=lambda size: (abs(size - chips), size))


def nearest_global_batch(global_batch: int, replicas: int) -> int:
    """The global batch nearest `global_batch` that gives each replica a whole multiple of 8 images."""
    return nearest_multiple(global_batch, replicas * REPLICA_BATCH_MULTIPLE)


@dataclass
class TpuSliceConfig(NativeConfig):
    chip: TpuChip | None = None  # the generation's chip (configs/device/tpu_<generation>.yaml)
    chips: int = 4  # chips in the slice: one of the chip's `slices`
    bn_group: int = 1  # replicas whose BatchNorm statistics are summed together (Google's distributed_group_size)
    steps_per_call: int | None = None  # steps per host call (TensorFlow's iterations_per_loop); None: one call per
    # block of epochs between evaluations, as Google's runs

    schema: ClassVar[str] = "tpu_slice"
    needs: ClassVar[str] = "a TPU chip: device=tpu_v2, tpu_v3, tpu_v4, tpu_v5e, tpu_v5p, tpu_v6e or tpu_v7"
    simulated: ClassVar[bool] = True
    projected: ClassVar[bool] = True
    family: ClassVar[str] = "projection.tpu.family.FAMILY"
    dealt_to: ClassVar[str] = "replicas"

    @property
    def chosen_chip(self) -> TpuChip:
        """The slice's chip (validation has made sure the config names one)."""
        assert self.chip is not None
        return self.chip

    @property
    def cores_per_replica(self) -> int:
        """TensorCores one replica runs on: the chip's two where they run as a megacore, else one."""
        chip = self.chosen_chip
        return chip.tensorcores if chip.megacore else 1

    @property
    def replicas(self) -> int:
        return self.chips * self.chosen_chip.tensorcores // self.cores_per_replica

    @property
    def torus(self) -> tuple[int, ...]:
        return torus_shape(self.chips, self.chosen_chip.torus_dims)

    @property
    def pods(self) -> int:
        return math.ceil(self.chips / self.chosen_chip.pod_chips)

    @property
    def hosts(self) -> int:
        return math.ceil(self.chips / self.chosen_chip.chips_per_host)

    def validate(self, bn_group_size: int, shape: BatchShape) -> None:
        """The slice must be one the chip's generation offers, and the batch deal to its replicas as a TPU takes
        it: a multiple of 8 images each."""
        super().validate(bn_group_size, shape)
        chip = self.chip
        if chip is None:
            raise ConfigError("device", f"{self.name} needs {self.needs}")
        require(not self.compile, "device.compile", "a simulated TPU runs eager: compile is for device=cpu or cuda")
        require(not self.cuda_graphs, "device.cuda_graphs", "a simulated TPU runs eager: CUDA graphs are for cuda")
        self.validate_chips(chip)
        require(
            self.replicas % shape.ranks == 0,
            "device.chips",
            f"{self.replicas} replicas of {chip.google_name(self.chips)} do not spread evenly over {shape.ranks} ranks",
        )
        require(bn_group_size == 1, "dist.bn_group_size", "a TPU slice's BatchNorm groups are device.bn_group")
        require(
            self.bn_group >= 1 and (self.replicas // shape.ranks) % self.bn_group == 0,
            "device.bn_group",
            f"BatchNorm groups of {self.bn_group} replicas must divide the {self.replicas // shape.ranks} replicas"
            " of a rank",
        )
        if self.steps_per_call is not None:
            positive(self.steps_per_call, "device.steps_per_call")
        self.validate_replica_batch(shape)

    def validate_chips(self, chip: TpuChip) -> None:
        offered = chip.offered()
        largest = offered[-1]
        require(
            self.chips <= largest,
            "device.chips",
            f"{self.chips} chips exceed the largest TPU {chip.name} slice, {largest:,} chips"
            f" ({chip.google_name(largest)})",
        )
        nearest = nearest_slice(self.chips, offered)
        require(
            self.chips in offered,
            "device.chips",
            f"TPU {chip.name} offers no slice of {self.chips} chips; the nearest is {nearest}"
            f" ({chip.google_name(nearest)})",
        )

    def validate_replica_batch(self, shape: BatchShape) -> None:
        """Each replica's images a step (its micro-batches') a multiple of 8, or the nearest global batch named."""
        if shape.global_batch % self.replicas:
            return  # the shared rule (configs.schema._validate_batch) names it
        per_replica = shape.global_batch // self.replicas
        fits = nearest_global_batch(shape.global_batch, self.replicas)
        require(
            per_replica % REPLICA_BATCH_MULTIPLE == 0,
            "data.global_batch",
            f"{shape.global_batch} images give each of the {self.replicas} replicas {per_replica}, not a multiple of"
            f" {REPLICA_BATCH_MULTIPLE} as a TPU takes them; the nearest that fits is data.global_batch={fits}"
            f" ({fits // self.replicas} per replica)",
        )

    def replica_count(self, world_size: int) -> int:
        return self.replicas

    def computes(self, precision: PrecisionConfig) -> PrecisionConfig:
        """As a TPU computes: bf16 matmuls accumulated in fp32 with fp32 master weights, so fp32 (the default) runs
        as precision=bf16; bf16 and bf16.16 as given; fp16 it has not."""
        require(
            precision.compute != "fp16",
            "precision",
            f"a TPU computes in bf16, not fp16 (precision={precision.name}): use precision=bf16 or bf16.16",
        )
        return replace(precision, name="bf16", compute="bf16") if precision.compute == "fp32" else precision

    def bn_group_of(self, dist_bn_group: int) -> int:
        return self.bn_group

    def device_time_platform(self) -> str | None:
        chip = self.chosen_chip
        return (
            f"{chip.google_name(self.chips)} ({self.chips} TPU {chip.name} chips) simulated by rn50perf (device time)"
        )

    def accelerator_fields(self) -> dict[str, str]:
        chip = self.chosen_chip
        return {
            "number_of_nodes": str(self.hosts),
            "accelerators_per_node": str(min(self.chips, chip.chips_per_host)),
            "accelerator_model_name": f"simulated TPU {chip.name} ({chip.google_name(self.chips)})",
            "accelerator_memory_capacity": f"{chip.hbm_bytes / 2**30:.0f} GiB HBM",
            "accelerator_interconnect": f"ICI, {'x'.join(map(str, self.torus))} torus",
            "hw_notes": "accelerators simulated by rn50perf's TPU family; host fields describe the machine that "
            "ran the simulation",
        }

    def imagenet_experiments(self) -> list[str]:
        return ["imagenet"]
