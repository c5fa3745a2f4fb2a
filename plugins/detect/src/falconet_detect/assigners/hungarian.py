"""Hungarian (set-prediction) assignment: each box gets exactly one anchor, at minimum cost.

The cost of an anchor for a box is ``-cls_weight * p(class) + l1_weight * L1 / image_extent -
giou_weight * GIoU``, computed on the device for the whole batch, padded to the largest box
count (not concatenated). On a CUDA GPU where torch-linear-assignment's Triton solver runs
(:mod:`falconet_detect.assigners.gpu_solver`) the batch is solved there, one program per
image, with nothing read back to the host, so the step can be recorded whole. Elsewhere the
costs are copied to the host once per step together with the counts and
``scipy.optimize.linear_sum_assignment`` solves each image (one synchronisation a step; the
assignment goes back from pinned memory, without a second wait). Both give the optimum of
each image's own problem.
"""

from __future__ import annotations

import torch

from falconet.contract import Assignment, Predictions
from falconet.data.targets import Targets
from falconet_detect.assigners.common import assignment
from falconet_detect.assigners.gpu_solver import gpu_solver, match_on_device
from falconet_detect.boxes import pairwise_giou, pairwise_iou


class HungarianAssigner:
    """``hungarian``: one-to-one matching (DETR-style costs) by the Hungarian algorithm."""

    name = "hungarian"
    summary = "one anchor per box at minimum cost: on the GPU without a host sync, else scipy"

    def __init__(
        self,
        cls_weight: float = 2.0,
        l1_weight: float = 5.0,
        giou_weight: float = 2.0,
        *,
        on_gpu: bool = True,
    ) -> None:
        """``on_gpu=False`` solves with scipy even where the GPU solver runs (the reference,
        and what ``tools/bench_assigner.py`` times the GPU solver against)."""
        self.cls_weight, self.l1_weight, self.giou_weight = cls_weight, l1_weight, giou_weight
        self.on_gpu = on_gpu

    def static_on(self, device: torch.device) -> bool:
        """On a CUDA device where the Triton solver runs (:func:`gpu_solver`), unless
        ``on_gpu`` is off; elsewhere scipy solves, reading the costs back once a step."""
        return self.on_gpu and device.type == "cuda" and gpu_solver() is not None

    @torch.no_grad()
    def __call__(self, predictions: Predictions, targets: Targets) -> Assignment:
        """Per slot (``[B, M, A]``): the per-box view is not used."""
        pred_scores, pred_boxes = predictions.scores, predictions.boxes
        gt_boxes, gt_labels = targets.boxes, targets.labels
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
        solve = gpu_solver() if cost.is_cuda and self.on_gpu else None
        if solve is not None:
            owner, foreground = match_on_device(cost, targets.counts, solve)
        else:
            owner, foreground = match_on_host(cost, targets.counts)
        quality = pairwise_iou(gt_boxes, pred_boxes).gather(1, owner[:, None]).squeeze(1)
        return assignment(owner, foreground, quality, predictions, targets)


def match_on_host(cost: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``owner [B, A]`` and ``foreground [B, A]`` by scipy, image by image, from one copy of
    ``cost [B, M, A]`` and the counts to the host (the step's one synchronisation)."""
    from scipy.optimize import linear_sum_assignment

    batch, slots, anchors = cost.shape
    host = torch.cat((cost.flatten().float(), counts.float())).cpu()
    costs = host[:-batch].view(batch, slots, anchors).numpy()
    # pinned, so the copy back to the device waits for nothing (a pageable copy would count as
    # a second synchronisation of the step)
    pin = cost.is_cuda
    owner = torch.zeros(batch, anchors, dtype=torch.int64, pin_memory=pin)
    foreground = torch.zeros(batch, anchors, pin_memory=pin)
    for b, count in enumerate(host[-batch:].long().tolist()):
        rows, cols = linear_sum_assignment(costs[b, :count])
        owner[b, torch.as_tensor(cols)] = torch.as_tensor(rows, dtype=torch.int64)
        foreground[b, torch.as_tensor(cols)] = 1.0
    return (
        owner.to(cost.device, non_blocking=True),
        foreground.to(cost.device, non_blocking=True),
    )
