"""How a run deals one weight update's images, worked out once from its configuration (configs.schema.batch_shape)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchShape:
    """How one weight update's `global_batch` images are dealt: over the ranks, to the data-parallel replicas (one
    per rank natively; a simulated IPU system's replicas, spread over the ranks), each taking `grad_accum`
    micro-batches; BatchNorm sees the micro-batches of `bn_group` replicas together."""

    global_batch: int
    ranks: int
    replicas: int
    grad_accum: int
    bn_group: int

    @property
    def per_rank(self) -> int:
        return self.global_batch // self.ranks

    @property
    def micro_batch(self) -> int:
        return self.global_batch // (self.replicas * self.grad_accum)

    @property
    def bn_span(self) -> int:
        """The images one BatchNorm's statistics cover."""
        return self.micro_batch * self.bn_group


def nearest_multiple(global_batch: int, step: int) -> int:
    """The global batch nearest `global_batch` that is a whole multiple of `step` images, at least one: what a
    refusal names where a batch does not deal."""
    return max(step, step * round(global_batch / step))
