"""A third party's label assigner that declares itself static, as a plugin: what an assigner
from outside falconet needs for a graph backend to record the whole step with it.

This module is the plugin (its ``register_assigners`` hook registers ``centre``); a test adds
it to a plugin manager, ``plugins.add_plugin(static_assigner, "static-assigner",
"falconet-testing", "0")``, and trains with ``assigner=centre``. Nothing in falconet names it:
the family asks the assigner (:meth:`CentreAssigner.static_on`), and the graph backend reads
the family's answer. Torch is imported inside the methods, as a plugin's items should.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from falconet.contract import Assignment
from falconet.registry import Register

if TYPE_CHECKING:
    import torch

    from falconet.contract import Predictions
    from falconet.data.targets import Targets


class CentreAssigner:
    """``centre``: each real box takes the ``k`` anchors whose centres lie nearest its own; an
    anchor that several boxes take goes to the nearest of them (the first slot among equals).
    Class targets are 1. Per slot (``[B, M, A]``): a distance, a ``topk`` of a fixed size, a
    scatter and an ``argmin``, so it is static-shaped and reads nothing back on any device."""

    name = "centre"
    summary = "each box's k nearest anchor centres (falconet-testing's static third party)"

    def __init__(self, k: int = 4) -> None:
        self.k = k

    def static_on(self, device: torch.device) -> bool:
        return True

    def __call__(self, predictions: Predictions, targets: Targets) -> Assignment:
        import torch

        with torch.no_grad():
            boxes, labels = targets.boxes, targets.labels  # [B, M, 4], [B, M]
            batch, anchors, _ = predictions.scores.shape
            slots = torch.arange(boxes.shape[1], device=boxes.device)
            real = (slots[None] < targets.counts[:, None])[..., None]  # [B, M, 1]
            centres = (boxes[..., :2] + boxes[..., 2:]) / 2
            offsets = predictions.anchor_points[None, None] - centres[:, :, None]  # [B, M, A, 2]
            distance = torch.where(real, offsets.pow(2).sum(-1), torch.inf)  # [B, M, A]
            nearest = distance.topk(min(self.k, anchors), dim=-1, largest=False).indices
            taken = torch.zeros_like(distance).scatter_(-1, nearest, 1.0) * real
            owner = torch.where(taken > 0, distance, torch.inf).argmin(1)  # [B, A]
            foreground = taken.amax(1)  # [B, A]
            owned_labels = labels.gather(1, owner)
            owned_boxes = boxes.gather(1, owner[..., None].expand(batch, anchors, 4))
            scores = torch.zeros_like(predictions.scores).scatter_(-1, owned_labels[..., None], 1)
            return Assignment(
                labels=owned_labels,
                boxes=owned_boxes,
                scores=scores * foreground[..., None],
                foreground=foreground,
            )


def register_assigners(register: Register) -> None:
    register(CentreAssigner())
