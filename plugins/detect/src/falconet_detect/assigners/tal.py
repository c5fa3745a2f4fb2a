"""Task-aligned assignment (TOOD / YOLOv8), static-shaped and free of host synchronisation.

For every ground-truth box, the alignment of an anchor is ``score ** alpha * IoU ** beta``,
where ``score`` is the predicted probability of the box's class. Each box takes the ``topk``
best-aligned anchors whose centres lie inside it; an anchor claimed by several boxes goes to
the one it overlaps most. Soft classification targets are the alignment, rescaled per box so
its best anchor's target equals that anchor's IoU.

It works on the batch's real boxes (the per-box view of :class:`falconet.data.targets.Targets`),
``[N, A]`` tensors rather than ``[B, M, A]``: with mosaic about one slot in eight is a real
box (docs/performance.md). Where the rule reduces over an image's boxes, it reduces over that
image's rows with ``index_add_`` (sums of 0 and 1, exact in any order) and ``index_reduce_``
(maxima and minima, exact in any order), so the assignment is bit for bit the per-slot
formulation's (``plugins/detect/tests/test_tal.py`` keeps that formulation as the reference).

Every mask is a multiplication and every selection a ``topk``, ``gather``, ``where`` or an
indexed reduction over tensors whose shapes depend only on ``B``, ``A``, ``C`` and the bucket
``(M, N)``: static-shaped and free of host synchronisation, so the whole step can be one graph.
"""

from __future__ import annotations

import warnings

import torch

from falconet.contract import Assignment, Predictions
from falconet.data.targets import Targets
from falconet_detect.assigners.common import assignment
from falconet_detect.boxes import pairwise_iou

EPS = 1e-9

# index_reduce_ (maxima and minima over an image's rows) warns once that its API is in beta;
# scatter_reduce_, the stable alternative, is refused by torch's deterministic mode on CUDA
warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")


class TaskAlignedAssigner:
    """``tal``: task-aligned top-k assignment (YOLOv8 defaults: topk 10, alpha 0.5, beta 6)."""

    name = "tal"
    summary = "task-aligned top-k (cls^alpha * IoU^beta); static-shaped, no host sync"

    def __init__(self, topk: int = 10, alpha: float = 0.5, beta: float = 6.0) -> None:
        self.topk, self.alpha, self.beta = topk, alpha, beta

    def static_on(self, device: torch.device) -> bool:
        """On every device: masks are multiplications and selections have fixed sizes
        (module docstring)."""
        return True

    @torch.no_grad()
    def __call__(self, predictions: Predictions, targets: Targets) -> Assignment:
        """Row ``n`` of the per-box view is box ``box_slots[n]`` of image ``box_images[n]``;
        image ``B`` marks padding. Intermediates are ``[N, A]``; per image ``[B + 1, A]``."""
        batch, anchors, _ = predictions.scores.shape
        slots = targets.boxes.shape[1]
        image, slot = targets.box_images, targets.box_slots
        real = (image < batch).float()
        owner_image = image.clamp(max=batch - 1)
        boxes = targets.boxes[owner_image, slot]  # [N, 4]
        labels = targets.labels[owner_image, slot]  # [N]
        inside = centres_inside(predictions.anchor_points, boxes[None])[0].float() * real[:, None]
        every_anchor = torch.arange(anchors, device=image.device)
        scores = predictions.scores[owner_image[:, None], every_anchor, labels[:, None]]
        ious = pairwise_iou(boxes[:, None], predictions.boxes[owner_image])[:, 0] * inside
        align = scores.pow(self.alpha) * ious.pow(self.beta) * inside  # [N, A]
        top = align.topk(min(self.topk, anchors), dim=-1).indices
        chosen = torch.zeros_like(align).scatter_(-1, top, 1.0) * inside

        def per_image(values: torch.Tensor, reduce: str, start: float) -> torch.Tensor:
            """``[B + 1, A]``: ``values [N, A]`` reduced over each image's rows (row ``B``
            collects the padding)."""
            out = values.new_full((batch + 1, anchors), start)
            if reduce == "sum":
                return out.index_add_(0, image, values)
            return out.index_reduce_(0, image, values, reduce, include_self=True)

        # an anchor claimed by several boxes goes to the one it overlaps most, the first slot
        # among equals (as an argmax over slots would)
        slot_value = slot[:, None].to(ious.dtype)
        claimed = per_image(chosen, "sum", 0.0)[image]  # [N, A]: boxes claiming the anchor
        best_iou = per_image(ious, "amax", 0.0)[image]
        ranked = torch.where(ious == best_iou, slot_value, float(slots))
        best = (slot_value == per_image(ranked, "amin", float(slots))[image]).to(chosen.dtype)
        chosen = torch.where(claimed > 1, best * inside, chosen)
        foreground = per_image(chosen, "sum", 0.0)[:batch].clamp(max=1)  # [B, A]
        align = align * chosen
        scale = (ious * chosen).amax(-1, keepdim=True) / (align.amax(-1, keepdim=True) + EPS)
        strength = per_image(align * scale, "amax", 0.0)[:batch]
        # at most one chosen row per anchor and image now: the sum is that row's slot
        owner = per_image(chosen * slot_value, "sum", 0.0)[:batch].long()
        return assignment(owner, foreground, strength, predictions, targets)


def centres_inside(anchor_points: torch.Tensor, gt_boxes: torch.Tensor) -> torch.Tensor:
    """``[B, M, A]``: whether each anchor centre (``[A, 2]``) lies more than ``EPS`` inside
    each box (``[B, M, 4]``, xyxy).

    Four ``[B, M, A]`` comparisons and-ed, rather than the four distances stacked into a
    ``[B, M, A, 4]`` tensor and reduced with ``amin``: the same distances and the same
    answer (the minimum exceeds ``EPS`` exactly when all four do, a NaN in neither), without
    writing and reading the stacked tensor, which on the GPU was the loss's largest copy."""
    x, y = anchor_points[:, 0], anchor_points[:, 1]
    x1, y1, x2, y2 = (gt_boxes[..., i, None] for i in range(4))
    return (x - x1 > EPS) & (y - y1 > EPS) & (x2 - x > EPS) & (y2 - y > EPS)
