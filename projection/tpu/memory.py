"""The memory plan of one replica of a TPU slice against its share of the chip's HBM, and its refusal.

Every replica is alike, so one is planned: its weights (the fp32 masters and their bf16 copy the MXUs read, or
bf16 masters alone), the optimizer's fp32 momentum, the fp32 gradients, the activations the probe measures stashed
for backward (per image, times the replica's micro-batch) and the step's input batch. A replica is a TensorCore,
with its share of the chip's HBM, or a megacore chip with all of it. What XLA keeps besides (its programs, its
scratch buffers) the probe cannot see, and the plan does not count.
"""

from __future__ import annotations

from dataclasses import dataclass

from projection.profile import ModelProfile
from projection.tpu.config import REPLICA_BATCH_MULTIPLE, TpuChip

GIB = 2**30
SHARES = ("weights", "optimizer", "gradients", "activations", "input")
MASTER_BYTES = {"fp32": 4 + 2, "bf16": 2}  # fp32 masters with their bf16 copy; bf16 masters are what the MXUs read
MOMENTUM_BYTES = 4
GRADIENT_BYTES = 4


@dataclass(frozen=True)
class ReplicaMemory:
    """One replica's HBM, by share, in bytes, and what it has."""

    weights: float
    optimizer: float
    gradients: float
    activations: float
    input: float
    limit: float
    where: str  # "a v4 megacore chip", "a TensorCore of a v3 chip"
    micro_batch: int  # images a replica holds the activations of at once
    per_image: float  # the activations and input one image of them adds

    @property
    def total(self) -> float:
        return sum(self.share(name) for name in SHARES)

    @property
    def fits(self) -> bool:
        return self.total <= self.limit

    def share(self, name: str) -> float:
        return float(getattr(self, name))

    def line(self) -> str:
        """The plan in one line: its total of the limit, by share, and what is left (or over)."""
        shares = ", ".join(f"{name} {self.share(name) / GIB:.2f}" for name in SHARES)
        left = self.limit - self.total
        room = f"{left / GIB:.2f} GiB free" if self.fits else f"{-left / GIB:.2f} GiB over"
        return f"{self.total / GIB:.2f} of {self.limit / GIB:.3g} GiB HBM ({shares} GiB), {room}"

    def largest_micro_batch(self) -> int:
        """The most images a replica's micro-batch could hold in the HBM left beside its weights and state, in
        whole multiples of 8 (0 where not even 8 fit)."""
        fixed = self.weights + self.optimizer + self.gradients
        images = int(max(0.0, self.limit - fixed) // self.per_image)
        return images - images % REPLICA_BATCH_MULTIPLE


def plan(
    profile: ModelProfile, chip: TpuChip, cores_per_replica: int, micro_batch: int, grad_accum: int, master: str
) -> ReplicaMemory:
    """A replica of `cores_per_replica` TensorCores of `chip` training `micro_batch` images a pass, `grad_accum`
    passes a step (its input holds the step's images), `master` its weights' dtype (fp32 or bf16); `profile` is
    the probe's, whose figures are per micro-batch of `profile.micro_batch` images."""
    params = profile.param_count
    activations = sum(stage.activation_bytes for stage in profile.stages) / profile.micro_batch
    input_image = profile.input_bytes / profile.micro_batch
    return ReplicaMemory(
        weights=params * MASTER_BYTES[master],
        optimizer=params * MOMENTUM_BYTES,
        gradients=params * GRADIENT_BYTES,
        activations=activations * micro_batch,
        input=input_image * micro_batch * grad_accum,
        limit=chip.hbm_bytes * cores_per_replica / chip.tensorcores,
        where=replica_of(chip, cores_per_replica),
        micro_batch=micro_batch,
        per_image=activations + input_image * grad_accum,
    )


def replica_of(chip: TpuChip, cores_per_replica: int) -> str:
    """What a replica runs on, as the plan's line names it."""
    if cores_per_replica < chip.tensorcores:
        return f"a TensorCore of a {chip.name} chip"
    return f"a {chip.name} megacore chip" if chip.megacore else f"a {chip.name} chip"
