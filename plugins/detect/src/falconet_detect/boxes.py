"""Box geometry for the loss and the assigners: pairwise IoU, CIoU, DFL distances.

Boxes are ``xyxy`` in pixels. Every division carries an epsilon, so padded (all-zero) target
boxes give finite numbers that the foreground mask then multiplies away: no NaN ever needs a
data-dependent branch.
"""

from __future__ import annotations

import math

import torch

EPS = 1e-7


def pairwise_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of every box in ``a [B, M, 4]`` with every box in ``b [B, A, 4]``: ``[B, M, A]``.

    The overlap's width and height are computed apart, each ``[B, M, A]``, and multiplied:
    the same arithmetic as a ``[B, M, A, 2]`` corner tensor reduced with ``prod``, with half
    the memory traffic in the assigners, where ``M x A`` is the largest shape of the loss."""
    ax1, ay1, ax2, ay2 = (a[:, :, None, i] for i in range(4))
    bx1, by1, bx2, by2 = (b[:, None, :, i] for i in range(4))
    width = (torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)).clamp(min=0)
    height = (torch.minimum(ay2, by2) - torch.maximum(ay1, by1)).clamp(min=0)
    inter = width * height
    area_a = (a[..., 2:] - a[..., :2]).clamp(min=0).prod(-1)
    area_b = (b[..., 2:] - b[..., :2]).clamp(min=0).prod(-1)
    return inter / (area_a[:, :, None] + area_b[:, None, :] - inter + EPS)


def ciou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Complete IoU of matching boxes ``a [..., 4]`` and ``b [..., 4]``: ``[...]``.

    IoU minus the normalised centre distance minus the aspect-ratio consistency term.

    The coordinates are taken with one ``unbind`` per box tensor, not one index per use:
    each of the 16 indexings of the predicted boxes had a backward of its own (a zero
    ``[..., 4]`` tensor with one column written), summed into the boxes' gradient one full
    tensor at a time; ``unbind`` sums each column's uses and stacks the four columns once.
    The values are the same, and so is every gradient (adding a zero column is exact).
    """
    ax1, ay1, ax2, ay2 = a.unbind(-1)
    bx1, by1, bx2, by2 = b.unbind(-1)
    wa, ha = (ax2 - ax1).clamp(min=0), (ay2 - ay1).clamp(min=0)
    wb, hb = (bx2 - bx1).clamp(min=0), (by2 - by1).clamp(min=0)
    iw = (torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)).clamp(min=0)
    ih = (torch.minimum(ay2, by2) - torch.maximum(ay1, by1)).clamp(min=0)
    inter = iw * ih
    iou = inter / (wa * ha + wb * hb - inter + EPS)
    cw = torch.maximum(ax2, bx2) - torch.minimum(ax1, bx1)
    ch = torch.maximum(ay2, by2) - torch.minimum(ay1, by1)
    diagonal = cw**2 + ch**2 + EPS
    centre = ((ax1 + ax2 - bx1 - bx2) ** 2 + (ay1 + ay2 - by1 - by2) ** 2) / 4
    v = (4 / math.pi**2) * (torch.atan(wb / (hb + EPS)) - torch.atan(wa / (ha + EPS))) ** 2
    with torch.no_grad():
        alpha = v / (v - iou + (1 + EPS))
    return iou - (centre / diagonal + v * alpha)


def decode(distances: torch.Tensor, anchors: torch.Tensor, strides: torch.Tensor) -> torch.Tensor:
    """``[B, A, 4]`` left/top/right/bottom distances (stride units) to xyxy pixels."""
    lt, rb = distances[..., :2] * strides, distances[..., 2:] * strides
    return torch.cat((anchors - lt, anchors + rb), -1)


def encode(
    boxes: torch.Tensor, anchors: torch.Tensor, strides: torch.Tensor, reg_max: int
) -> torch.Tensor:
    """xyxy pixels to left/top/right/bottom distances in stride units, within the DFL range."""
    lt = (anchors - boxes[..., :2]) / strides
    rb = (boxes[..., 2:] - anchors) / strides
    return torch.cat((lt, rb), -1).clamp(0, reg_max - 1 - 0.01)


def pairwise_giou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Generalised IoU of every box in ``a [B, M, 4]`` with every box in ``b [B, A, 4]``."""
    iou = pairwise_iou(a, b)
    lt = torch.minimum(a[:, :, None, :2], b[:, None, :, :2])
    rb = torch.maximum(a[:, :, None, 2:], b[:, None, :, 2:])
    hull = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[..., 2:] - a[..., :2]).clamp(min=0).prod(-1)
    area_b = (b[..., 2:] - b[..., :2]).clamp(min=0).prod(-1)
    inter_union = area_a[:, :, None] + area_b[:, None, :]
    union = inter_union / (1 + iou)  # area_a + area_b - inter, recovered from the IoU
    return iou - (hull - union) / (hull + EPS)
