"""Box arithmetic: the pairwise IoU's per-coordinate form is the corner-tensor form exactly;
CIoU from unbound coordinates is the per-use indexing form exactly, gradients included."""

from __future__ import annotations

import math
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from falconet_detect.boxes import EPS, ciou, pairwise_iou


def corner_tensor_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The former formulation: ``[B, M, A, 2]`` corners reduced with ``prod``."""
    lt = torch.maximum(a[:, :, None, :2], b[:, None, :, :2])
    rb = torch.minimum(a[:, :, None, 2:], b[:, None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[..., 2:] - a[..., :2]).clamp(min=0).prod(-1)
    area_b = (b[..., 2:] - b[..., :2]).clamp(min=0).prod(-1)
    return inter / (area_a[:, :, None] + area_b[:, None, :] - inter + EPS)


def test_pairwise_iou_equals_the_corner_tensor_form_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(2, 7, 4, generator=gen) * 100
    b = torch.rand(2, 50, 4, generator=gen) * 100
    a[..., 2:] += a[..., :2]
    b[..., 2:] += b[..., :2] * 0.5
    a[0, 0] = torch.tensor([0.0, 0.0, 0.0, 0.0])  # padding slot
    a[0, 1] = torch.tensor([10.0, 10.0, 5.0, 5.0])  # inverted
    b[0, 0] = a[0, 2]  # identical box: IoU 1
    b[1, 0] = torch.tensor([1e4, 1e4, 1e4 + 1, 1e4 + 1])  # disjoint
    got = pairwise_iou(a, b)
    assert got.shape == (2, 7, 50)
    assert torch.equal(got, corner_tensor_iou(a, b))
    assert torch.isclose(got[0, 2, 0], torch.tensor(1.0)) and torch.all(got[1, :, 0] == 0)
    for dtype in (torch.float64, torch.bfloat16):
        assert torch.equal(
            pairwise_iou(a.to(dtype), b.to(dtype)), corner_tensor_iou(a.to(dtype), b.to(dtype))
        )


def indexed_ciou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The former formulation: every coordinate indexed where it is used."""
    wa, ha = (a[..., 2] - a[..., 0]).clamp(min=0), (a[..., 3] - a[..., 1]).clamp(min=0)
    wb, hb = (b[..., 2] - b[..., 0]).clamp(min=0), (b[..., 3] - b[..., 1]).clamp(min=0)
    iw = (torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])).clamp(min=0)
    ih = (torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])).clamp(min=0)
    inter = iw * ih
    iou = inter / (wa * ha + wb * hb - inter + EPS)
    cw = torch.maximum(a[..., 2], b[..., 2]) - torch.minimum(a[..., 0], b[..., 0])
    ch = torch.maximum(a[..., 3], b[..., 3]) - torch.minimum(a[..., 1], b[..., 1])
    diagonal = cw**2 + ch**2 + EPS
    centre = (
        (a[..., 0] + a[..., 2] - b[..., 0] - b[..., 2]) ** 2
        + (a[..., 1] + a[..., 3] - b[..., 1] - b[..., 3]) ** 2
    ) / 4
    v = (4 / math.pi**2) * (torch.atan(wb / (hb + EPS)) - torch.atan(wa / (ha + EPS))) ** 2
    with torch.no_grad():
        alpha = v / (v - iou + (1 + EPS))
    return iou - (centre / diagonal + v * alpha)


class BackwardOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def test_ciou_from_unbound_coordinates_equals_the_indexed_form_with_its_gradients():
    """As the loss calls it: predicted boxes that need a gradient, targets with padding
    (all-zero boxes) and inverted boxes; forward and gradient bit for bit, in float32,
    float64 and bfloat16, and the backward without the 16 per-index copies."""
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        pred = torch.rand(3, 200, 4, generator=gen) * 300
        pred[..., 2:] += pred[..., :2]
        pred[0, :5, 2:] = pred[0, :5, :2] - 1  # inverted: clamped widths and heights
        target = torch.rand(3, 200, 4, generator=gen) * 300
        target[..., 2:] += target[..., :2]
        target[1, :20] = 0  # padding
        weight = torch.rand(3, 200, generator=gen)
        grads, values, ops = [], [], []
        for fn in (indexed_ciou, ciou):
            a = pred.to(dtype).requires_grad_()
            value = fn(a, target.to(dtype))
            counted = BackwardOps()
            with counted:
                (grad,) = torch.autograd.grad((value * weight.to(dtype)).sum(), a)
            values.append(value.detach())
            grads.append(grad)
            ops.append(counted.count)
        assert torch.equal(values[0], values[1]), dtype
        assert torch.equal(grads[0], grads[1]), dtype
        assert ops[0]["aten.select_backward"] == 16 and ops[1]["aten.select_backward"] == 0
