"""What the assigners share: a one-hot without checks and the final Assignment."""

from __future__ import annotations

import torch

from falconet.contract import Assignment, Predictions
from falconet.data.targets import Targets


def one_hot(index: torch.Tensor, classes: int, dtype: torch.dtype) -> torch.Tensor:
    """One-hot in ``dtype`` directly: one scatter, no int64 intermediate and no value check
    (``F.one_hot`` checks the range on the host on CPU). ``index`` is in range by construction
    here (labels and box slots)."""
    out = torch.zeros(*index.shape, classes, dtype=dtype, device=index.device)
    return out.scatter_(-1, index.unsqueeze(-1), 1)


def assignment(
    owner: torch.Tensor,
    foreground: torch.Tensor,
    strength: torch.Tensor,
    predictions: Predictions,
    targets: Targets,
) -> Assignment:
    """The :class:`Assignment` of anchors to ``targets``' boxes ``owner [B, A]`` (slots), with
    ``foreground [B, A]`` (1 or 0) and the class-target ``strength [B, A]``: every assigner
    ends here, so all of them hand the loss the same layout (class targets in the dtype of
    the predicted scores)."""
    classes, dtype = predictions.scores.shape[-1], predictions.scores.dtype
    labels = targets.labels.gather(1, owner)
    boxes = targets.boxes.gather(1, owner[..., None].expand(*owner.shape, 4))
    scores = one_hot(labels, classes, dtype) * (foreground * strength)[..., None]
    return Assignment(labels=labels, boxes=boxes, scores=scores, foreground=foreground)
