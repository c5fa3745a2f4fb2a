"""From raw outputs to detections: decode, confidence threshold, class-aware NMS, ``max_det``.

Output follows the torchvision contract: one ``{boxes [N, 4] xyxy, scores [N], labels [N]}``
per image, boxes in pixels of the network input (the caller undoes its letterbox). NMS is
torchvision's ``batched_nms`` when torchvision imports, else :func:`nms_torch`, a plain-torch
greedy NMS that gives the same result (tested against torchvision).
"""

from __future__ import annotations

import torch

from falconet_detect.boxes import decode
from falconet_detect.network import REG_MAX


def nms_torch(
    boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, iou: float
) -> torch.Tensor:
    """Class-aware greedy NMS: indices kept, by decreasing score (torchvision's semantics)."""
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.int64, device=boxes.device)
    offset = labels.to(boxes.dtype)[:, None] * (boxes.max() + 1)  # classes never overlap
    shifted = boxes + offset
    order = scores.argsort(descending=True, stable=True)
    shifted = shifted[order]
    lt = torch.maximum(shifted[:, None, :2], shifted[None, :, :2])
    rb = torch.minimum(shifted[:, None, 2:], shifted[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = (shifted[:, 2:] - shifted[:, :2]).clamp(min=0).prod(-1)
    overlap = inter / (area[:, None] + area[None, :] - inter)
    suppressed = torch.zeros(len(order), dtype=torch.bool, device=boxes.device)
    keep = []
    for i in range(len(order)):  # postprocess is outside the training step: a loop is fine
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed |= overlap[i] > iou
    return order[torch.tensor(keep, dtype=torch.int64, device=boxes.device)]


def batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, iou: float
) -> torch.Tensor:
    try:
        from torchvision.ops import batched_nms as tv_batched_nms
    except Exception:  # torchvision absent or built for another torch
        return nms_torch(boxes, scores, labels, iou)
    return tv_batched_nms(boxes, scores, labels, iou)


def decode_outputs(
    outputs: tuple[torch.Tensor, ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The network's raw outputs as every anchor's box ``[B, A, 4]`` (xyxy pixels of the input)
    and class probabilities ``[B, A, C]``, both float32: the exported graph's outputs
    (:mod:`falconet_detect.export`). Shape operations only, so a traced graph keeps its batch
    dimension dynamic."""
    box_logits, cls_logits, anchors, strides = outputs
    b, a, _ = box_logits.shape
    bins = torch.arange(REG_MAX, device=box_logits.device, dtype=torch.float32)
    distances = box_logits.float().view(b, a, 4, REG_MAX).softmax(-1) @ bins
    return decode(distances, anchors, strides), cls_logits.float().sigmoid()


@torch.no_grad()
def postprocess(
    outputs: tuple[torch.Tensor, ...],
    *,
    conf: float = 0.25,
    iou: float = 0.7,
    max_det: int = 300,
    max_candidates: int = 30000,
    multi_label: bool = False,
) -> list[dict[str, torch.Tensor]]:
    """Detections per image. ``multi_label`` keeps every class above ``conf`` per anchor (for
    evaluation, where it raises recall); otherwise each anchor keeps its best class."""
    boxes, scores = decode_outputs(outputs)
    return select(
        boxes,
        scores,
        conf=conf,
        iou=iou,
        max_det=max_det,
        max_candidates=max_candidates,
        multi_label=multi_label,
    )


@torch.no_grad()
def select(
    all_boxes: torch.Tensor,
    all_scores: torch.Tensor,
    *,
    conf: float = 0.25,
    iou: float = 0.7,
    max_det: int = 300,
    max_candidates: int = 30000,
    multi_label: bool = False,
) -> list[dict[str, torch.Tensor]]:
    """Detections per image from decoded ``boxes [B, A, 4]`` and ``scores [B, A, C]``
    (:func:`decode_outputs`, or an exported graph's outputs): confidence threshold, the
    ``max_candidates`` best, class-aware NMS at ``iou``, the ``max_det`` best."""
    results = []
    for boxes, scores in zip(all_boxes, all_scores, strict=True):
        if multi_label:
            anchor, label = (scores > conf).nonzero(as_tuple=True)
            score = scores[anchor, label]
        else:
            score, label = scores.max(1)
            anchor = (score > conf).nonzero(as_tuple=True)[0]
            score, label = score[anchor], label[anchor]
        if len(score) > max_candidates:
            top = score.topk(max_candidates).indices
            anchor, label, score = anchor[top], label[top], score[top]
        keep = batched_nms(boxes[anchor], score, label, iou)[:max_det]
        results.append({"boxes": boxes[anchor][keep], "scores": score[keep], "labels": label[keep]})
    return results
