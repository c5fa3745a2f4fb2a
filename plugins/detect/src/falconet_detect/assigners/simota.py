"""SimOTA (YOLOX): dynamic-k assignment by a classification + IoU cost, static-shaped.

Candidates of a box are anchors whose centres lie inside it or within ``radius`` strides of
its centre. The cost of an anchor for a box is the BCE of its predicted class probability
against that class plus ``iou_weight * -log(IoU)``, plus a large constant outside the
candidates. Each box takes its ``k`` cheapest anchors, where ``k`` is the sum of its ten best
IoUs (at least 1); an anchor taken twice goes to the cheaper box. Dynamic ``k`` is a mask over
the ranks of a fixed-size ``topk``, so shapes never depend on the data and nothing syncs.
"""

from __future__ import annotations

import torch

from falconet.contract import Assignment, Predictions
from falconet.data.targets import Targets
from falconet_detect.assigners.common import assignment, one_hot
from falconet_detect.boxes import pairwise_iou

EPS = 1e-8
OUTSIDE = 1e5


class SimOTAAssigner:
    """``simota``: YOLOX's dynamic-k assignment."""

    name = "simota"
    summary = "YOLOX dynamic-k by cls + IoU cost; static-shaped, no host sync"

    def __init__(self, candidates: int = 10, radius: float = 2.5, iou_weight: float = 3.0) -> None:
        self.candidates, self.radius, self.iou_weight = candidates, radius, iou_weight

    def static_on(self, device: torch.device) -> bool:
        """Nowhere yet: its shapes are static (module docstring), but the whole step has not
        been recorded with it and checked against eager on a GPU, so no backend records it."""
        return False

    @torch.no_grad()
    def __call__(self, predictions: Predictions, targets: Targets) -> Assignment:
        """Per slot (``[B, M, A]``): the per-box view is not used."""
        pred_scores, pred_boxes = predictions.scores, predictions.boxes
        gt_boxes, gt_labels = targets.boxes, targets.labels
        batch, anchors, _ = pred_scores.shape
        slots = gt_boxes.shape[1]
        real = (torch.arange(slots, device=gt_boxes.device)[None] < targets.counts[:, None]).float()
        points = predictions.anchor_points[None, None]  # [1, 1, A, 2]
        inside = (
            torch.cat(
                (points - gt_boxes[:, :, None, :2], gt_boxes[:, :, None, 2:] - points), -1
            ).amin(-1)
            > 0
        )
        centres = (gt_boxes[..., :2] + gt_boxes[..., 2:]) / 2
        radius = self.radius * predictions.anchor_strides.reshape(1, 1, anchors, 1)
        near = ((points - centres[:, :, None]).abs() < radius).all(-1)
        candidate = (inside | near).float() * real[..., None]  # [B, M, A]
        ious = pairwise_iou(gt_boxes, pred_boxes) * candidate
        probs = pred_scores.gather(2, gt_labels[:, None, :].expand(batch, anchors, slots))
        cls_cost = -torch.log(probs.transpose(1, 2).clamp(EPS, 1.0))  # BCE against 1
        cost = cls_cost + self.iou_weight * -torch.log(ious + EPS) + OUTSIDE * (1 - candidate)
        k = min(self.candidates, anchors)
        dynamic_k = ious.topk(k, dim=-1).values.sum(-1).int().clamp(min=1)  # [B, M]
        order = cost.topk(k, dim=-1, largest=False).indices  # [B, M, k], cheapest first
        take = (torch.arange(k, device=cost.device) < dynamic_k[..., None]).float()
        chosen = torch.zeros_like(cost).scatter_(-1, order, take) * candidate
        cheapest = one_hot(cost.argmin(1), slots, chosen.dtype).transpose(1, 2)
        chosen = torch.where(chosen.sum(1, keepdim=True) > 1, cheapest * chosen, chosen)
        foreground = chosen.sum(1).clamp(max=1)
        quality = (ious * chosen).sum(1)  # IoU with the assigned box: the class target
        return assignment(chosen.argmax(1), foreground, quality, predictions, targets)
