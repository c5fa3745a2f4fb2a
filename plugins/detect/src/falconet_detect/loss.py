"""The YOLO loss: BCE classification against soft targets, CIoU box loss, DFL.

Static-shaped and free of host synchronisation: the assigner's foreground mask multiplies the
per-anchor losses (no boolean indexing), the normaliser (the sum of soft targets, at least 1)
stays on the device, and no Python branch looks at the data. Each part is a mean per unit of
target score over the global batch: in a distributed run the normaliser is summed over the
ranks (:func:`falconet.ops.rank_sum`) and each rank divides by its share of it, so that DDP's
average of the ranks' gradients is the gradient of the single-process loss at the same global
batch; the loss is never multiplied by the world size.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from falconet import ops
from falconet.contract import Assigner, Predictions
from falconet.data.targets import Targets
from falconet_detect.boxes import ciou, decode, encode
from falconet_detect.network import REG_MAX

GAINS = {"box": 7.5, "cls": 0.5, "dfl": 1.5}


class YoloLoss:
    """``loss(outputs, targets) -> (total [], {"box", "cls", "dfl"})``, each part ``[]``.

    :param assigner: any registered assigner.
    :param outputs: the network's ``(box [B, A, 4 * reg_max], cls [B, A, C], anchors [A, 2],
        strides [A, 1])``.
    :param targets: the batch's :class:`falconet.data.targets.Targets` (boxes xyxy pixels of
        the network input), handed to the assigner with the detached predictions.
    """

    def __init__(self, assigner: Assigner, gains: Mapping[str, float] | None = None) -> None:
        self.assigner = assigner
        self.gains = dict(GAINS, **(gains or {}))
        self._bins: dict[tuple, torch.Tensor] = {}

    def __call__(
        self, outputs: tuple[torch.Tensor, ...], targets: Targets
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # the loss and the assignment run outside autocast, in at least fp32: the network may
        # run in bf16, its targets and distribution expectations may not
        with torch.autocast(outputs[0].device.type, enabled=False):
            return self._loss(outputs, targets)

    def _loss(
        self, outputs: tuple[torch.Tensor, ...], targets: Targets
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        box_logits, cls_logits, anchors, strides = outputs
        dtype = torch.promote_types(box_logits.dtype, torch.float32)
        box_logits, cls_logits = box_logits.to(dtype), cls_logits.to(dtype)
        b, a, _ = box_logits.shape
        key = (box_logits.device, dtype)
        if key not in self._bins:
            self._bins[key] = torch.arange(REG_MAX, device=box_logits.device, dtype=dtype)
        bins = self._bins[key]
        distances = box_logits.view(b, a, 4, REG_MAX).softmax(-1) @ bins
        pred_boxes = decode(distances, anchors, strides)
        predictions = Predictions(
            cls_logits.detach().sigmoid(), pred_boxes.detach(), anchors, strides
        )
        target = self.assigner(predictions, targets)
        # the global batch's normaliser, its share per rank: DDP averages the ranks' gradients
        norm = ops.rank_sum(target.scores.sum()).clamp(min=1.0)
        if (ranks := ops.world_size()) > 1:
            norm = norm / ranks
        cls = F.binary_cross_entropy_with_logits(cls_logits, target.scores, reduction="sum") / norm
        weight = target.scores.sum(-1) * target.foreground  # [B, A]
        box = ((1.0 - ciou(pred_boxes, target.boxes)) * weight).sum() / norm
        dfl = (
            self._dfl(
                box_logits.view(b, a, 4, REG_MAX), encode(target.boxes, anchors, strides, REG_MAX)
            )
            * weight
        ).sum() / norm
        parts = {"box": box, "cls": cls, "dfl": dfl}
        total = sum(self.gains[k] * v for k, v in parts.items())
        return total, {k: v.detach() for k, v in parts.items()}

    @staticmethod
    def _dfl(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Distribution focal loss: cross-entropy to the two bins around each target distance,
        weighted by closeness; mean over the four sides. ``[B, A]``.

        Both bins come from one ``gather``: its backward writes the two (always distinct)
        bins into one zero ``[B, A, 4, REG_MAX]`` gradient, where a gather per bin zeroed two
        and summed them, the same numbers at a third of that traffic."""
        left = target.long()
        right_weight = target - left
        log_probs = logits.log_softmax(-1)
        at_left, at_right = log_probs.gather(-1, torch.stack((left, left + 1), -1)).unbind(-1)
        loss = -(at_left * (1 - right_weight) + at_right * right_weight)
        return loss.mean(-1)
