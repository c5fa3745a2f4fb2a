"""Helpers shared by the assigners."""

from __future__ import annotations

import torch


def one_hot(index: torch.Tensor, classes: int, dtype: torch.dtype) -> torch.Tensor:
    """One-hot in ``dtype`` directly: one scatter, no int64 intermediate and no value check
    (``F.one_hot`` checks the range on the host on CPU). ``index`` is in range by construction
    here (labels and box slots)."""
    out = torch.zeros(*index.shape, classes, dtype=dtype, device=index.device)
    return out.scatter_(-1, index.unsqueeze(-1), 1)
