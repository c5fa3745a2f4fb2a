"""Hungarian (set-prediction) assignment: each box gets exactly one anchor, at minimum cost.

The cost of an anchor for a box is ``-cls_weight * p(class) + l1_weight * L1 / image_extent -
giou_weight * GIoU``, computed on the device for the whole batch, padded to the largest box
count (not concatenated), and copied to the host once per step together with the counts:
``scipy.optimize.linear_sum_assignment`` runs on the CPU, so this assigner synchronises once
per step by design; the assignment goes back from pinned memory, without a second wait (use
``tal`` or ``simota`` for a capturable, sync-free step).
"""

from __future__ import annotations

import torch

from falconet.data.targets import Targets
from falconet.interfaces import Assignment, Predictions
from falconet_detect.assigners.common import assignment
from falconet_detect.boxes import pairwise_giou, pairwise_iou


class HungarianAssigner:
    """``hungarian``: one-to-one matching (DETR-style costs) by the Hungarian algorithm."""

    name = "hungarian"
    summary = "one anchor per box by linear_sum_assignment on the CPU (one sync per step)"

    def __init__(
        self, cls_weight: float = 2.0, l1_weight: float = 5.0, giou_weight: float = 2.0
    ) -> None:
        self.cls_weight, self.l1_weight, self.giou_weight = cls_weight, l1_weight, giou_weight

    @torch.no_grad()
    def __call__(self, predictions: Predictions, targets: Targets) -> Assignment:
        """Per slot (``[B, M, A]``): the per-box view is not used."""
        pred_scores, pred_boxes = predictions.scores, predictions.boxes
        gt_boxes, gt_labels = targets.boxes, targets.labels
        from scipy.optimize import linear_sum_assignment

        batch, anchors, _ = pred_scores.shape
        slots = gt_boxes.shape[1]
        extent = predictions.anchor_points.max().clamp(min=1.0) * 2  # about the image size, pixels
        probs = pred_scores.gather(2, gt_labels[:, None, :].expand(batch, anchors, slots))
        l1 = (gt_boxes[:, :, None] - pred_boxes[:, None]).abs().sum(-1) / extent
        cost = (
            -self.cls_weight * probs.transpose(1, 2)
            + self.l1_weight * l1
            - self.giou_weight * pairwise_giou(gt_boxes, pred_boxes)
        )  # [B, M, A]
        host = torch.cat((cost.flatten().float(), targets.counts.float())).cpu()  # the one sync
        costs = host[:-batch].view(batch, slots, anchors).numpy()
        counts = host[-batch:].long().tolist()
        # pinned, so the copy back to the device below waits for nothing (a pageable copy would
        # count as a second synchronisation of the step)
        pin = pred_scores.is_cuda
        owner = torch.zeros(batch, anchors, dtype=torch.int64, pin_memory=pin)
        foreground = torch.zeros(batch, anchors, pin_memory=pin)
        for b, count in enumerate(counts):
            rows, cols = linear_sum_assignment(costs[b, :count])
            owner[b, torch.as_tensor(cols)] = torch.as_tensor(rows, dtype=torch.int64)
            foreground[b, torch.as_tensor(cols)] = 1.0
        device = pred_scores.device
        owner = owner.to(device, non_blocking=True)
        foreground = foreground.to(device, non_blocking=True)
        quality = pairwise_iou(gt_boxes, pred_boxes).gather(1, owner[:, None]).squeeze(1)
        return assignment(owner, foreground, quality, predictions, targets)
