"""The per-IPU memory plan of one replica, and its refusal in the style of the IPU compiler's out-of-memory report.

Every replica is alike, so one is planned: one IPU per pipeline stage, each holding its stage's weights, optimizer
state, gradients and stashed activations, plus a stated allowance for what the probe cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass

from projection.ipu.config import OPTIMIZER_STATES, Chip
from projection.profile import ModelProfile

# Code, vertex state, exchange buffers and control programs are invisible from PyTorch: an assumed constant, not a
# measurement. 180 MB (20 % of the 900 MB) is in the 150-200 MB range usually quoted for a ResNet-50 graph, and
# keeps Graphcore's MLPerf v1.1 recipe (20 images per micro-batch with recomputation on one GC200, which did fit)
# fitting by this plan's measured figures, which it would stop doing above about 235 MB.
CODE_AND_EXCHANGE_BYTES = 180e6
ACCUMULATOR_BYTES = 4  # gradient accumulators are fp32 whatever the weights' dtype, so small gradients add up
MB = 1e6
CATEGORIES = ("weights", "optimizer", "gradients", "activations", "code")
ADVICE = {
    "activations": "device.recompute=auto (stash only each block's output and recompute the rest in backward)",
    "recomputed activations": "a smaller micro-batch, or more device.pipeline_splits (fewer layers per IPU)",
    "weights": "more device.pipeline_splits (the weights spread over more IPUs), or 16-bit master weights",
    "optimizer": "optimizer state in streaming memory (device.optimizer_state=streaming)",
    "gradients": "more device.pipeline_splits (the gradient accumulators spread over more IPUs)",
    "code": "more device.pipeline_splits (less code per IPU)",
}


class OutOfMemory(ValueError):
    """A plan that does not fit; the message is the per-IPU table and a suggestion."""


@dataclass(frozen=True)
class IpuMemory:
    """One IPU's share of a replica, in MB."""

    name: str  # "ipu0 (conv1)": the IPU and the module its stage begins at
    micro_batches: int  # in flight: the micro-batches whose activations the stage holds at once
    weights_mb: float
    optimizer_mb: float
    gradients_mb: float
    activations_mb: float
    code_mb: float
    limit_mb: float

    def mb(self, category: str) -> float:
        return float(getattr(self, f"{category}_mb"))

    @property
    def total_mb(self) -> float:
        return sum(self.mb(category) for category in CATEGORIES)

    @property
    def excess_mb(self) -> float:
        return max(0.0, self.total_mb - self.limit_mb)


@dataclass(frozen=True)
class MemoryPlan:
    rows: tuple[IpuMemory, ...]  # one per IPU of a replica
    chip: str
    recompute: bool  # whether the profile already recomputes, which changes the advice on activations

    @property
    def fits(self) -> bool:
        return all(row.excess_mb == 0 for row in self.rows)

    def table(self) -> str:
        width = max(len(row.name) for row in self.rows)
        header = ("in flight", *CATEGORIES[:-1], "code+exchange", "total", "limit", "excess")
        columns = f"{'IPU':<{width}}" + "".join(f"{h:>15}" for h in header)
        lines = [f"IPU memory of one replica, MB ({self.chip})", columns]
        for row in self.rows:
            figures = [row.mb(c) for c in CATEGORIES] + [row.total_mb, row.limit_mb, row.excess_mb]
            lines.append(f"{row.name:<{width}}{row.micro_batches:>15}" + "".join(f"{x:>15.1f}" for x in figures))
        return "\n".join(lines)

    def suggestion(self) -> str:
        """What would help the fullest IPU, by its largest share."""
        worst = max(self.rows, key=lambda row: (row.excess_mb, row.total_mb))
        if self.fits:
            return f"fits: {worst.limit_mb - worst.total_mb:.0f} MB free on the fullest IPU ({worst.name})"
        category = max(CATEGORIES, key=worst.mb)
        advice = ADVICE["recomputed activations" if category == "activations" and self.recompute else category]
        return (
            f"{worst.name} needs {worst.total_mb:.0f} MB of {worst.limit_mb:.0f} MB ({worst.excess_mb:.0f} MB over); "
            f"its largest share is {category} ({worst.mb(category):.0f} MB): try {advice}"
        )

    def check(self) -> None:
        if not self.fits:
            raise OutOfMemory(f"IPU out of memory\n{self.table()}\n{self.suggestion()}")


def in_flight(stage: int, stages: int, grad_accum: int, sharded: bool = False) -> int:
    """Micro-batches whose activations stage `stage` of `stages` stashes at once in Graphcore's grouped pipeline:
    a micro-batch's backward reaches stage i 2 (S - 1 - i) steps after its forward, and every step runs one forward
    first, so 2 (S - 1 - i) + 1 (1 on the last stage, which runs forward and backward back to back), and never
    more than the micro-batches of a weight update. Sharded, one: a micro-batch's backward ends before the next
    enters."""
    if sharded:
        return 1
    return min(grad_accum, 2 * (stages - 1 - stage) + 1)


def _row(
    profile: ModelProfile,
    index: int,
    chip: Chip,
    masters: int,
    slot_bytes: int,
    accum: int,
    code_bytes: float,
    flight: int,
) -> IpuMemory:
    stage = profile.stages[index]
    params, dtype = stage.param_count, profile.activation_dtype_bytes
    return IpuMemory(
        name=f"ipu{index} ({stage.first_module})",
        micro_batches=flight,
        # the compute copy at the activation dtype, and the master copy beside it when it is wider (16.32)
        weights_mb=params * (dtype + (masters if masters > dtype else 0)) / MB,
        optimizer_mb=params * slot_bytes / MB,
        # accumulators over micro-batches; with none, the gradients themselves wait for the all-reduce and update
        gradients_mb=params * (ACCUMULATOR_BYTES if accum > 1 else dtype) / MB,
        activations_mb=(stage.activation_bytes * flight + stage.recompute_peak_bytes) / MB,
        code_mb=code_bytes / MB,
        limit_mb=chip.sram_bytes / MB,
    )


def plan_memory(
    profile: ModelProfile,
    chip: Chip,
    *,
    master_bytes: int,
    optimizer_slots: int,
    optimizer_state: str,
    grad_accum: int,
    sharded: bool = False,
    code_bytes: float = CODE_AND_EXCHANGE_BYTES,
) -> MemoryPlan:
    """The memory of each IPU of one replica (one IPU per stage of `profile`). `master_bytes` is the master
    weights' width (4 for fp32, 2 for 16-bit), `optimizer_slots` the state tensors per weight at that width
    (1 for SGD or LARS momentum), kept "on_chip" or in "streaming" memory (off chip: none of the 900 MB);
    `sharded` stages stash one micro-batch each."""
    if optimizer_state not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer_state must be one of {', '.join(OPTIMIZER_STATES)}, not {optimizer_state!r}")
    slot_bytes = optimizer_slots * master_bytes if optimizer_state == "on_chip" else 0
    stages = len(profile.stages)
    rows = tuple(
        _row(
            profile,
            i,
            chip,
            master_bytes,
            slot_bytes,
            grad_accum,
            code_bytes,
            in_flight(i, stages, grad_accum, sharded),
        )
        for i in range(stages)
    )
    recompute = any(stage.recompute_peak_bytes for stage in profile.stages)
    return MemoryPlan(rows, chip.name, recompute)
