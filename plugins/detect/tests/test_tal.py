"""Task-aligned assignment on hand-built cases with known answers."""

from __future__ import annotations

import pytest
import torch

from falconet_detect.assigners.tal import EPS, TaskAlignedAssigner, centres_inside


def grid(n: int = 8, stride: float = 8.0) -> torch.Tensor:
    """Anchor points of an ``n x n`` grid, centres at (i + 0.5) * stride."""
    ys, xs = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    return (torch.stack((xs, ys), -1).reshape(-1, 2).float() + 0.5) * stride


def boxes_around(points: torch.Tensor, half: float = 4.0) -> torch.Tensor:
    return torch.cat((points - half, points + half), -1)


def test_picks_the_best_aligned_anchors_inside_the_box_only():
    anchors = grid()
    gt = torch.tensor([[[0.0, 0.0, 24.0, 24.0], [0, 0, 0, 0]]])  # 3x3 cells; second is padding
    scores = torch.full((1, 64, 2), 0.5)
    preds = boxes_around(anchors)[None].clone()
    preds[0, 9] = torch.tensor([0.0, 0.0, 24.0, 24.0])  # anchor (1, 1) predicts the box exactly
    out = TaskAlignedAssigner(topk=4)(
        scores, preds, anchors, gt, torch.tensor([[1, 0]]), torch.tensor([1])
    )
    chosen = out.foreground[0].nonzero().flatten().tolist()
    inside = [0, 1, 2, 8, 9, 10, 16, 17, 18]
    assert len(chosen) == 4 and set(chosen) <= set(inside) and 9 in chosen
    assert out.labels[0, 9].item() == 1
    assert out.boxes[0, 9].tolist() == [0.0, 0.0, 24.0, 24.0]
    # soft target: the best anchor's target equals its IoU (1.0 here), the rest are smaller
    assert out.scores[0, 9, 1].item() == pytest.approx(1.0, abs=1e-6)
    assert out.scores[0, 9, 0].item() == 0.0
    assert (out.scores[0, chosen, 1] <= out.scores[0, 9, 1]).all()
    background = [i for i in range(64) if i not in chosen]
    assert out.scores[0, background].abs().sum() == 0


def test_an_anchor_claimed_twice_goes_to_the_box_it_overlaps_most():
    anchors = grid()
    big = [0.0, 0.0, 32.0, 32.0]
    small = [8.0, 8.0, 24.0, 24.0]
    preds = boxes_around(anchors)[None].clone()
    preds[0, 9] = torch.tensor(small)  # anchor 9 lies in both; it predicts the small box
    out = TaskAlignedAssigner(topk=16)(
        torch.ones(1, 64, 3) * 0.5,
        preds,
        anchors,
        torch.tensor([[big, small]]),
        torch.tensor([[0, 2]]),
        torch.tensor([2]),
    )
    assert out.labels[0, 9].item() == 2 and out.boxes[0, 9].tolist() == small
    assert (out.foreground <= 1).all()  # each anchor assigned at most once


def test_padded_targets_and_empty_images_assign_nothing():
    anchors = grid()
    gt = torch.zeros(2, 4, 4)
    gt[0, 0] = torch.tensor([0.0, 0.0, 64.0, 64.0])
    out = TaskAlignedAssigner()(
        torch.rand(2, 64, 5),
        boxes_around(anchors)[None].expand(2, -1, -1),
        anchors,
        gt,
        torch.zeros(2, 4, dtype=torch.long),
        torch.tensor([0, 0]),
    )
    assert out.foreground.sum() == 0 and out.scores.sum() == 0


def test_shapes_depend_only_on_batch_anchors_classes_and_slots():
    anchors = grid()
    out = TaskAlignedAssigner()(
        torch.rand(3, 64, 5),
        torch.rand(3, 64, 4) * 64,
        anchors,
        torch.rand(3, 8, 4) * 64,
        torch.zeros(3, 8, dtype=torch.long),
        torch.tensor([8, 0, 3]),
    )
    assert out.labels.shape == (3, 64) and out.boxes.shape == (3, 64, 4)
    assert out.scores.shape == (3, 64, 5) and out.foreground.shape == (3, 64)


def test_centres_inside_equals_the_minimum_of_the_four_distances():
    """The and-ed comparisons give exactly the stacked-distances-and-``amin`` answer, on
    centres on the edges, a hair inside, outside, and boxes with NaN or inverted corners."""
    gen = torch.Generator().manual_seed(0)
    anchors = torch.rand(300, 2, generator=gen) * 64
    anchors[:4] = torch.tensor([[10.0, 10.0], [10.0 + 2e-9, 20.0], [30.0, 30.0], [0.0, 64.0]])
    boxes = torch.rand(3, 5, 4, generator=gen) * 64
    boxes[..., 2:] += boxes[..., :2]
    boxes[0, 0] = torch.tensor([10.0, 10.0, 30.0, 30.0])  # centres exactly on its edges
    boxes[0, 1] = torch.tensor([30.0, 30.0, 10.0, 10.0])  # inverted
    boxes[1, 0, 2] = float("nan")
    stacked = torch.cat(
        (anchors[None, None] - boxes[:, :, None, :2], boxes[:, :, None, 2:] - anchors[None, None]),
        -1,
    )
    expected = stacked.amin(-1) > EPS
    got = centres_inside(anchors, boxes)
    assert got.shape == (3, 5, 300) and got.dtype == torch.bool
    assert torch.equal(got, expected)
    assert expected.any() and not expected.all()
    assert not got[0, 0, 0] and not got[1, 0].any()  # on an edge: out; NaN corner: out
