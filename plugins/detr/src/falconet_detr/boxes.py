"""Box conversions and the GIoU the DETR loss needs (elementwise: the matcher has its own)."""

from __future__ import annotations

import torch


def cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), -1)


def xyxy_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    x1, y1, x2, y2 = boxes.unbind(-1)
    return torch.stack(((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1), -1)


def inverse_sigmoid(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    x = x.clamp(eps, 1 - eps)
    return torch.log(x / (1 - x))


def area(sides: torch.Tensor) -> torch.Tensor:
    """``sides[..., 0] * sides[..., 1]``: written out, because ``prod``'s backward on CUDA asks
    the host whether any factor is zero, a synchronisation per call in a loss that has none."""
    return sides[..., 0] * sides[..., 1]


def iou_and_giou(
    a: torch.Tensor, b: torch.Tensor, eps: float = 1e-7
) -> tuple[torch.Tensor, torch.Tensor]:
    """IoU and generalised IoU of matching xyxy boxes ``a [..., 4]`` and ``b [..., 4]``."""
    low, high = torch.maximum(a[..., :2], b[..., :2]), torch.minimum(a[..., 2:], b[..., 2:])
    inter = area((high - low).clamp(min=0))
    area_a = area((a[..., 2:] - a[..., :2]).clamp(min=0))
    area_b = area((b[..., 2:] - b[..., :2]).clamp(min=0))
    union = area_a + area_b - inter
    iou = inter / (union + eps)
    hull = torch.maximum(a[..., 2:], b[..., 2:]) - torch.minimum(a[..., :2], b[..., :2])
    hull = area(hull.clamp(min=0))
    return iou, iou - (hull - union) / (hull + eps)
