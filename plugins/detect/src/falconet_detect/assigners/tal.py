"""Task-aligned assignment (TOOD / YOLOv8), static-shaped and free of host synchronisation.

For every ground-truth box, the alignment of an anchor is ``score ** alpha * IoU ** beta``,
where ``score`` is the predicted probability of the box's class. Each box takes the ``topk``
best-aligned anchors whose centres lie inside it; an anchor claimed by several boxes goes to
the one it overlaps most. Soft classification targets are the alignment, rescaled per box so
its best anchor's target equals that anchor's IoU.

Every mask is a multiplication and every selection a ``topk``, ``gather`` or ``where`` over
tensors whose shapes depend only on ``B``, ``A``, ``C`` and the padded box count ``M``.

Given the batch's real boxes (``box_rows``, :mod:`falconet.data.targets`), the same assignment
is computed per box, ``[N, A]`` instead of ``[B, M, A]``: with mosaic about one slot in eight
is a real box, and the per-slot form spent most of its time on padding (1.44 against 0.47 ms
at batch 16, 5.38 against 1.35 ms at batch 64, replayed on an H200; docs/performance.md).
Where the per-slot form reduces over an image's slots, the per-box form reduces over the rows
of that image with ``index_add_`` (sums of 0 and 1, exact in any order) and
``index_reduce_`` (maxima and minima, exact in any order), so both give the same assignment
bit for bit for finite predictions (tested; on the GPU on the trainer's own batches too).
"""

from __future__ import annotations

import warnings

import torch

from falconet.interfaces import Assignment
from falconet_detect.assigners.common import assignment, one_hot
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

    @torch.no_grad()
    def __call__(
        self,
        pred_scores: torch.Tensor,
        pred_boxes: torch.Tensor,
        anchor_points: torch.Tensor,
        gt_boxes: torch.Tensor,
        gt_labels: torch.Tensor,
        gt_counts: torch.Tensor,
        anchor_strides: torch.Tensor | None = None,
        box_rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> Assignment:
        if box_rows is not None:
            return self._per_box(
                pred_scores, pred_boxes, anchor_points, gt_boxes, gt_labels, *box_rows
            )
        batch, anchors, classes = pred_scores.shape
        slots = gt_boxes.shape[1]
        real = (torch.arange(slots, device=gt_boxes.device)[None] < gt_counts[:, None]).float()
        inside = centres_inside(anchor_points, gt_boxes).float() * real[..., None]  # [B, M, A]
        scores = pred_scores.gather(2, gt_labels[:, None, :].expand(batch, anchors, slots))
        ious = pairwise_iou(gt_boxes, pred_boxes) * inside  # [B, M, A]
        align = scores.transpose(1, 2).pow(self.alpha) * ious.pow(self.beta) * inside
        top = align.topk(min(self.topk, anchors), dim=-1).indices
        chosen = torch.zeros_like(align).scatter_(-1, top, 1.0) * inside  # [B, M, A]
        claimed = chosen.sum(1, keepdim=True)  # [B, 1, A]
        best = one_hot(ious.argmax(1), slots, chosen.dtype).transpose(1, 2)
        chosen = torch.where(claimed > 1, best * inside, chosen)
        foreground = chosen.sum(1).clamp(max=1)  # [B, A]
        align = align * chosen
        scale = (ious * chosen).amax(-1, keepdim=True) / (align.amax(-1, keepdim=True) + EPS)
        strength = (align * scale).amax(1)  # [B, A]
        return assignment(
            chosen.argmax(1), foreground, strength, gt_boxes, gt_labels, classes, pred_scores.dtype
        )

    def _per_box(
        self,
        pred_scores: torch.Tensor,
        pred_boxes: torch.Tensor,
        anchor_points: torch.Tensor,
        gt_boxes: torch.Tensor,
        gt_labels: torch.Tensor,
        image: torch.Tensor,
        slot: torch.Tensor,
    ) -> Assignment:
        """:meth:`__call__`'s assignment over the ``N`` rows of ``box_rows`` (row ``n`` is
        box ``slot[n]`` of image ``image[n]``; image ``B`` marks padding)."""
        batch, anchors, classes = pred_scores.shape
        slots = gt_boxes.shape[1]
        real = (image < batch).float()
        owner_image = image.clamp(max=batch - 1)
        boxes, labels = gt_boxes[owner_image, slot], gt_labels[owner_image, slot]  # [N, 4], [N]
        inside = centres_inside(anchor_points, boxes[None])[0].float() * real[:, None]  # [N, A]
        every_anchor = torch.arange(anchors, device=image.device)
        scores = pred_scores[owner_image[:, None], every_anchor, labels[:, None]]
        ious = pairwise_iou(boxes[:, None], pred_boxes[owner_image])[:, 0] * inside
        align = scores.pow(self.alpha) * ious.pow(self.beta) * inside
        top = align.topk(min(self.topk, anchors), dim=-1).indices
        chosen = torch.zeros_like(align).scatter_(-1, top, 1.0) * inside

        def per_image(values: torch.Tensor, reduce: str, start: float) -> torch.Tensor:
            """``[B + 1, A]``: ``values [N, A]`` reduced over each image's rows (row ``B``
            collects the padding)."""
            out = values.new_full((batch + 1, anchors), start)
            if reduce == "sum":
                return out.index_add_(0, image, values)
            return out.index_reduce_(0, image, values, reduce, include_self=True)

        slot_value = slot[:, None].to(ious.dtype)
        claimed = per_image(chosen, "sum", 0.0)[image]  # [N, A]: boxes claiming the anchor
        best_iou = per_image(ious, "amax", 0.0)[image]
        # the per-slot form's argmax takes the first slot of the largest IoU; so does this
        ranked = torch.where(ious == best_iou, slot_value, float(slots))
        best = (slot_value == per_image(ranked, "amin", float(slots))[image]).to(chosen.dtype)
        chosen = torch.where(claimed > 1, best * inside, chosen)
        foreground = per_image(chosen, "sum", 0.0)[:batch].clamp(max=1)
        align = align * chosen
        scale = (ious * chosen).amax(-1, keepdim=True) / (align.amax(-1, keepdim=True) + EPS)
        strength = per_image(align * scale, "amax", 0.0)[:batch]
        # at most one chosen row per anchor and image now: the sum is that row's slot
        owner = per_image(chosen * slot_value, "sum", 0.0)[:batch].long()
        return assignment(
            owner, foreground, strength, gt_boxes, gt_labels, classes, pred_scores.dtype
        )


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
