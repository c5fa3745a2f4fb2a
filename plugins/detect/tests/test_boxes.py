"""Box arithmetic: the pairwise IoU's per-coordinate form is the corner-tensor form exactly."""

from __future__ import annotations

import torch

from falconet_detect.boxes import EPS, pairwise_iou


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
