"""Which samples each rank reads in each epoch, and the seed that draws each sample's augmentation."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class ShardedSampler(Sampler[tuple[int, int]]):
    """Yields (dataset index, sample seed) for one rank.

    Training: a fresh permutation per epoch from (seed, epoch), cut to a multiple of the global batch so every
    step is full, and dealt round-robin to ranks. Evaluation: every index once, in order, dealt the same way.
    The sample seed is a pure function of (seed, epoch, position), so a run resumed anywhere in an epoch (it
    starts the epoch at its position), or read by any number of workers, sees exactly the same crops and flips.
    """

    def __init__(
        self,
        size: int,
        *,
        seed: int,
        shuffle: bool,
        global_batch: int = 1,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.size = size
        self.seed = seed
        self.shuffle = shuffle
        self.global_batch = global_batch
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Read `epoch` from this rank's `start`-th sample on (0: all of it)."""
        self.epoch = epoch
        self.start = start

    def _order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.size)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=generator)
        return order[: self.size - self.size % self.global_batch]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        order = self._order()
        positions = range(self.rank, len(order), self.world_size)[self.start :]
        base = (self.seed * 1_000_003 + self.epoch) * 10_000_019
        return ((int(order[p]), (base + p) % 2**63) for p in positions)

    def __len__(self) -> int:
        total = self.size - self.size % self.global_batch if self.shuffle else self.size
        return len(range(self.rank, total, self.world_size)[self.start :])
