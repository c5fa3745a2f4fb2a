"""Task-aligned assignment on hand-built cases with known answers, and bit for bit against
the per-slot formulation of the rule (kept here as the reference)."""

from __future__ import annotations

import pytest
import torch

from falconet.contract import Predictions
from falconet.data.targets import Targets
from falconet_detect.assigners.common import assignment, one_hot
from falconet_detect.assigners.tal import EPS, TaskAlignedAssigner, centres_inside
from falconet_detect.boxes import pairwise_iou
from falconet_testing.contracts.assigner import assigner_inputs


def grid(n: int = 8, stride: float = 8.0) -> torch.Tensor:
    """Anchor points of an ``n x n`` grid, centres at (i + 0.5) * stride."""
    ys, xs = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    return (torch.stack((xs, ys), -1).reshape(-1, 2).float() + 0.5) * stride


def boxes_around(points: torch.Tensor, half: float = 4.0) -> torch.Tensor:
    return torch.cat((points - half, points + half), -1)


def tal(scores, preds, anchors, gt, labels, counts, **options):
    """TAL on these tensors (strides 8: TAL does not read them)."""
    predictions = Predictions(scores, preds, anchors, torch.full((len(anchors), 1), 8.0))
    targets = Targets.from_padded(gt, labels, counts)
    return TaskAlignedAssigner(**options)(predictions, targets)


def per_slot_tal(predictions: Predictions, targets: Targets, topk=10, alpha=0.5, beta=6.0):
    """The rule over ``[B, M, A]`` slots, as TAL was first written: the reference the per-box
    implementation must equal bit for bit."""
    scores_all, pred_boxes = predictions.scores, predictions.boxes
    gt_boxes, gt_labels, counts = targets.boxes, targets.labels, targets.counts
    batch, anchors, _ = scores_all.shape
    slots = gt_boxes.shape[1]
    real = (torch.arange(slots)[None] < counts[:, None]).float()
    inside = centres_inside(predictions.anchor_points, gt_boxes).float() * real[..., None]
    scores = scores_all.gather(2, gt_labels[:, None, :].expand(batch, anchors, slots))
    ious = pairwise_iou(gt_boxes, pred_boxes) * inside  # [B, M, A]
    align = scores.transpose(1, 2).pow(alpha) * ious.pow(beta) * inside
    top = align.topk(min(topk, anchors), dim=-1).indices
    chosen = torch.zeros_like(align).scatter_(-1, top, 1.0) * inside
    best = one_hot(ious.argmax(1), slots, chosen.dtype).transpose(1, 2)
    chosen = torch.where(chosen.sum(1, keepdim=True) > 1, best * inside, chosen)
    foreground = chosen.sum(1).clamp(max=1)
    align = align * chosen
    scale = (ious * chosen).amax(-1, keepdim=True) / (align.amax(-1, keepdim=True) + EPS)
    strength = (align * scale).amax(1)
    return assignment(chosen.argmax(1), foreground, strength, predictions, targets)


def assert_same(got, want) -> None:
    for field in ("labels", "boxes", "scores", "foreground"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field


def test_picks_the_best_aligned_anchors_inside_the_box_only():
    anchors = grid()
    gt = torch.tensor([[[0.0, 0.0, 24.0, 24.0], [0, 0, 0, 0]]])  # 3x3 cells; second is padding
    scores = torch.full((1, 64, 2), 0.5)
    preds = boxes_around(anchors)[None].clone()
    preds[0, 9] = torch.tensor([0.0, 0.0, 24.0, 24.0])  # anchor (1, 1) predicts the box exactly
    out = tal(scores, preds, anchors, gt, torch.tensor([[1, 0]]), torch.tensor([1]), topk=4)
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
    out = tal(
        torch.ones(1, 64, 3) * 0.5,
        preds,
        anchors,
        torch.tensor([[big, small]]),
        torch.tensor([[0, 2]]),
        torch.tensor([2]),
        topk=16,
    )
    assert out.labels[0, 9].item() == 2 and out.boxes[0, 9].tolist() == small
    assert (out.foreground <= 1).all()  # each anchor assigned at most once


def test_padded_targets_and_empty_images_assign_nothing():
    anchors = grid()
    gt = torch.zeros(2, 4, 4)
    gt[0, 0] = torch.tensor([0.0, 0.0, 64.0, 64.0])
    out = tal(
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
    out = tal(
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


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("bucket", [None, (16, 32)], ids=["batch", "larger"])
def test_per_box_equals_the_per_slot_rule(seed, bucket):
    """On the contract's random cases, in the batch's bucket and padded to a larger one."""
    predictions, targets = assigner_inputs(seed)
    padded = targets if bucket is None else targets.padded(bucket)
    assert_same(TaskAlignedAssigner()(predictions, padded), per_slot_tal(predictions, targets))


def test_per_box_breaks_ties_as_per_slot_does():
    """Two boxes in the same place, of different classes, claim anchors with the same IoU:
    per slot, ``argmax`` gives such an anchor to the first slot; per box must pick the same
    slot (the labels tell them apart)."""
    predictions, targets = assigner_inputs(7)
    targets.boxes[2, 4] = targets.boxes[2, 1]
    targets.labels[2, 4] = (targets.labels[2, 1] + 1) % 4
    want = per_slot_tal(predictions, targets)
    place = (want.boxes[2] == targets.boxes[2, 1]).all(-1)
    assert (want.foreground[2] * place).sum() > 0  # the shared place has anchors
    assert_same(TaskAlignedAssigner()(predictions, targets), want)
