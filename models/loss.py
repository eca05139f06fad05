"""The training objective: label-smoothed cross-entropy, computed in fp32 (or wider) whatever the logits' dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def smoothed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, smoothing: float) -> torch.Tensor:
    """Mean over the batch of -sum_k q_k log p_k with q = (1 - smoothing) one-hot + smoothing / classes."""
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float64 stays float64, for tests
    return F.cross_entropy(wide, labels, label_smoothing=smoothing)
