"""One seed for every random generator of a process, offset by its rank so that ranks draw differently."""

import random

import numpy as np
import torch


def seed_everything(seed: int, rank: int) -> None:
    """Seed Python's, NumPy's and torch's generators with `seed + rank`."""
    random.seed(seed + rank)
    np.random.seed(seed + rank)
    torch.manual_seed(seed + rank)
