"""The DETR loss: varifocal classification, L1 and GIoU boxes, on every decoder layer, on the
encoder's proposals and on the denoising queries.

Every decoder layer and the proposals are matched anew, as in RT-DETR: each depth's queries
to the boxes by the ``hungarian`` assigner (falconet-detect's, through the registry), and each
depth's terms are computed against its own matching. The depths are stacked into the batch
dimension (:func:`stacked_targets`), so the step still makes one assigner call: one batched
solve on the GPU with no host round trip where the assigner's GPU solver runs, else the cost
matrices and counts copied to the host once. One matching of the last layer serving every
depth (query ``i`` of every layer is one query refined) learned far more slowly on the overfit
check (docs/detr.md). The denoising queries need no matching (each knows its target).

Query groups (Group DETR; the model's ``query_groups`` G): every depth's G query sets are
matched to the boxes each on its own, one-to-one, so a box has G positives a depth; the groups
are stacked into the batch dimension with the depths, still one assigner call, and each
group's terms are averaged over the groups (the papers' normalisation: the one-to-one terms
weigh what one group's would). With G = 1 the loss is the one-group loss bit for bit.

Every term is a sum over queries divided by the global batch's box count (summed over the
ranks, :func:`falconet.ops.rank_sum`, and shared per rank as the YOLO loss does), the
denoising terms by that count times the denoising groups (each group holds every box once);
it runs in float32 outside autocast whatever precision the network ran in.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from falconet import ops
from falconet.contract import Assigner, Predictions
from falconet.data.targets import Targets
from falconet_detr.boxes import cxcywh_to_xyxy, iou_and_giou, xyxy_to_cxcywh
from falconet_detr.denoising import denoising_queries
from falconet_detr.network import DetrNet, DetrOutputs

WEIGHTS = {"vfl": 1.0, "l1": 5.0, "giou": 2.0}
ALPHA, GAMMA = 0.75, 2.0
DENOISING_GROUPS = 5


class DetrLoss:
    """``loss(outputs, targets) -> (total [], {"vfl", "l1", "giou"})`` (module docstring)."""

    def __init__(
        self,
        model: DetrNet,
        assigner: Assigner,
        weights: Mapping[str, float] | None = None,
        groups: int = DENOISING_GROUPS,
    ) -> None:
        self.model, self.assigner, self.groups = model, assigner, groups
        self.query_groups = model.query_groups
        self.weights = dict(WEIGHTS, **(weights or {}))

    def __call__(
        self, outputs: DetrOutputs, targets: Targets
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # the denoising pass is network: it runs in the forward's precision (DetrNet.denoise)
        dn = denoising_queries(targets, outputs.scale, outputs.logits.shape[-1], self.groups)
        denoised = self.model.denoise(outputs.levels, dn)
        with torch.autocast(outputs.scale.device.type, enabled=False):
            return self._loss(outputs, targets, dn, denoised)

    def _loss(self, outputs: DetrOutputs, targets: Targets, dn, denoised):
        scale = outputs.scale
        logits, boxes = outputs.logits.float(), outputs.boxes.float()
        depths, batch, grouped = logits.shape[:3]
        groups = self.query_groups
        queries = grouped // groups
        # the decoder's layers and the proposals, each query group of each one matching
        # problem: [depths + 1, G, B, Q] stacked depth after depth, group after group
        all_logits = by_group(torch.cat((logits, outputs.enc_logits.float()[None])), groups)
        all_boxes = by_group(torch.cat((boxes, outputs.enc_boxes.float()[None])), groups)
        all_logits, all_boxes = all_logits.detach(), all_boxes.detach()
        predictions = Predictions(
            all_logits.sigmoid().flatten(0, 2),
            cxcywh_to_xyxy(all_boxes).flatten(0, 2) * scale,
            # queries have no spatial anchor: the image's centre, so the assigner's image extent
            # (twice the largest anchor coordinate) is the input's long side
            (scale[:2].max() / 2).expand(queries, 2),
            torch.ones(queries, 1, device=scale.device),
        )
        matched = self.assigner(predictions, stacked_targets(targets, (depths + 1) * groups))
        shape = (depths + 1, groups, batch, queries)
        labels = from_groups(matched.labels.view(shape))
        foreground = from_groups(matched.foreground.view(shape))
        target_boxes = xyxy_to_cxcywh(from_groups(matched.boxes.view(*shape, 4)) / scale)
        everything = torch.ones_like(foreground)
        norm = ops.rank_sum(targets.counts.sum().float()).clamp(min=1.0)
        if (ranks := ops.world_size()) > 1:
            norm = norm / ranks
        dn_logits, dn_boxes = denoised
        # three calls, each over every layer at once (a leading layer dimension): the loss's
        # kernel count does not grow with the decoder's depth
        terms = (
            self._terms(
                logits, boxes, labels[:-1], target_boxes[:-1], foreground[:-1], everything[:-1]
            ),
            self._terms(
                outputs.enc_logits.float(),
                outputs.enc_boxes.float(),
                labels[-1],
                target_boxes[-1],
                foreground[-1],
                everything[-1],
            ),
            self._terms(
                dn_logits.float(),
                dn_boxes.float(),
                dn.target_labels,
                dn.target_boxes,
                dn.positive,
                dn.real,
            ),
        )
        matched, proposals, denoising = terms
        one_to_one = {k: matched[k] + proposals[k] for k in WEIGHTS}
        if groups > 1:  # each group's terms weigh as one set's (Group DETR's average)
            one_to_one = {k: v / groups for k, v in one_to_one.items()}
        # the denoising queries hold every box once per group: their sums are divided by the
        # box count times the groups (RT-DETR's and DN-DETR's normalisation), so they weigh as
        # one matched set; divided by the box count alone they weighed `groups` times that and
        # were most of the loss and of its gradient at the start (5x the matched terms' share)
        parts = {k: (one_to_one[k] + denoising[k] / self.groups) / norm for k in WEIGHTS}
        total = sum(self.weights[k] * v for k, v in parts.items())
        return total, {k: v.detach() for k, v in parts.items()}

    @staticmethod
    def _terms(logits, boxes, labels, target_boxes, positive, counted) -> dict[str, torch.Tensor]:
        """Sums over queries (and layers: ``logits [..., B, Q, C]`` and ``boxes [..., B, Q,
        4]`` may lead with a layer dimension; the targets are ``[B, Q]`` and broadcast):
        varifocal loss where ``counted``, box losses where ``positive`` (float masks)."""
        iou, giou = iou_and_giou(cxcywh_to_xyxy(boxes), cxcywh_to_xyxy(target_boxes))
        index = labels[..., None].expand(*logits.shape[:-1], 1)
        onehot = torch.zeros_like(logits).scatter_(-1, index, 1.0) * positive[..., None]
        score = onehot * iou.detach().clamp(min=0)[..., None]
        probability = logits.detach().sigmoid()
        weight = (ALPHA * probability.pow(GAMMA) * (1 - onehot) + score) * counted[..., None]
        vfl = F.binary_cross_entropy_with_logits(logits, score, weight=weight, reduction="sum")
        l1 = ((boxes - target_boxes).abs().sum(-1) * positive).sum()
        return {"vfl": vfl, "l1": l1, "giou": ((1 - giou) * positive).sum()}


def by_group(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[D, B, G x Q, ...]`` (the queries group after group) as ``[D, G, B, Q, ...]``."""
    d, b, grouped = x.shape[:3]
    return x.view(d, b, groups, grouped // groups, *x.shape[3:]).transpose(1, 2)


def from_groups(x: torch.Tensor) -> torch.Tensor:
    """``[D, G, B, Q, ...]`` back to ``[D, B, G x Q, ...]`` (:func:`by_group`'s inverse)."""
    d, g, b, q = x.shape[:4]
    return x.transpose(1, 2).reshape(d, b, g * q, *x.shape[4:])


def stacked_targets(targets: Targets, copies: int) -> Targets:
    """``targets`` of a batch of ``B`` images as those of ``copies * B`` images, copy ``k``
    holding images ``k * B`` to ``k * B + B - 1``: the per-image view repeated, the per-box view
    with its image indices shifted per copy (padding rows point at image ``copies * B``, none)."""
    batch = targets.boxes.shape[0]
    shift = torch.arange(copies, device=targets.box_images.device)[:, None] * batch
    images = torch.where(
        targets.box_images[None] == batch, copies * batch, targets.box_images[None] + shift
    )
    return Targets(
        targets.boxes.repeat(copies, 1, 1),
        targets.labels.repeat(copies, 1),
        targets.counts.repeat(copies),
        images.flatten(),
        targets.box_slots.repeat(copies),
    )
