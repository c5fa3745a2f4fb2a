"""Postprocess: the plain-torch NMS agrees with torchvision's; decoding and thresholds."""

from __future__ import annotations

import pytest
import torch

from falconet_detect.postprocess import nms_torch, postprocess


def random_boxes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 200
    wh = torch.rand(n, 2, generator=g) * 60 + 5
    scores = (torch.rand(n, generator=g) * 20).round() / 20  # ties included
    return torch.cat((xy, xy + wh), 1), scores, torch.randint(0, 4, (n,), generator=g)


@pytest.mark.parametrize("seed", range(5))
def test_plain_torch_nms_agrees_with_torchvision(seed):
    ops = pytest.importorskip("torchvision.ops", reason="torchvision is the reference here")
    boxes, scores, labels = random_boxes(300, seed)
    for iou in (0.3, 0.5, 0.7):
        ours = nms_torch(boxes, scores, labels, iou)
        theirs = ops.batched_nms(boxes, scores, labels, iou)
        assert set(ours.tolist()) == set(theirs.tolist())
        assert torch.equal(scores[ours], scores[theirs])  # same order, by score


def test_postprocess_contract_and_limits():
    a, c = 100, 3
    box_logits = torch.zeros(2, a, 64)
    cls_logits = torch.full((2, a, c), -10.0)
    cls_logits[0, :5, 1] = 5.0  # five confident anchors in image 0, class 1
    anchors = (torch.arange(a).float()[:, None].expand(a, 2) * 8) + 4
    strides = torch.full((a, 1), 8.0)
    out = postprocess((box_logits, cls_logits, anchors, strides), conf=0.25, max_det=3)
    assert len(out) == 2 and len(out[1]["scores"]) == 0
    assert len(out[0]["scores"]) == 3 and (out[0]["labels"] == 1).all()
    assert out[0]["boxes"].shape == (3, 4)
    assert (out[0]["boxes"][:, 2:] > out[0]["boxes"][:, :2]).all()
