"""The denoising groups: static shapes, targets and masks per slot, noise within its bounds,
and batches with no box at all."""

from __future__ import annotations

import torch

from falconet.data.targets import Targets, box_rows
from falconet_detr.boxes import cxcywh_to_xyxy
from falconet_detr.denoising import denoising_queries

SCALE = torch.tensor([100.0, 80.0, 100.0, 80.0])


def targets(counts: list[int], bucket: int = 4) -> Targets:
    torch.manual_seed(1)
    b = len(counts)
    boxes = torch.zeros(b, bucket, 4)
    labels = torch.zeros(b, bucket, dtype=torch.int64)
    for i, count in enumerate(counts):
        corner = torch.rand(count, 2) * 50
        boxes[i, :count] = torch.cat((corner, corner + 10 + torch.rand(count, 2) * 20), 1)
        labels[i, :count] = torch.randint(0, 5, (count,))
    counts_t = torch.tensor(counts)
    images, slots = box_rows(counts_t)
    return Targets(boxes, labels, counts_t, images, slots)


def test_groups_hold_every_slot_twice_and_see_only_their_own_real_slots():
    t = targets([2, 0, 4])
    dn = denoising_queries(t, SCALE, classes=5, groups=3, label_noise=0.0)
    total = 3 * 2 * 4
    assert dn.labels.shape == (3, total) and dn.mask.shape == (3, 1, total, total)
    real = dn.real.view(3, 3, 2, 4)
    assert real[0, :, :, :2].all() and not real[0, :, :, 2:].any() and not real[1].any()
    assert torch.equal(dn.positive.view(3, 3, 2, 4)[:, :, 1], torch.zeros(3, 3, 4))
    assert torch.equal(dn.target_labels.view(3, 3, 2, 4)[0, 1, 0], t.labels[0])
    assert torch.equal(dn.labels, dn.target_labels)  # no label noise asked for
    mask = dn.mask[:, 0]
    group = torch.arange(total) // 8
    for b in range(3):
        for i in range(total):
            seen = mask[b, i].nonzero().flatten()
            assert (group[seen] == group[i]).all()  # never another group
            assert all(dn.real[b, j] > 0 or j == i for j in seen.tolist())
            assert mask[b, i, i]  # every row attends somewhere: no NaN from an empty softmax


def test_positives_stay_within_half_their_size_and_negatives_go_further():
    t = targets([4, 4], bucket=4)
    dn = denoising_queries(t, SCALE, classes=5, groups=50)
    noised = cxcywh_to_xyxy(dn.reference_logits.sigmoid()).view(2, 50, 2, 4, 4)
    truth = cxcywh_to_xyxy(dn.target_boxes).view(2, 50, 2, 4, 4)
    half = (truth[..., 2:] - truth[..., :2]).repeat(1, 1, 1, 1, 2) / 2
    moved = (noised - truth).abs() / half
    assert moved[:, :, 0].max() <= 1 + 1e-3
    # a negative's corners may cross (its box then has no size) or leave the image: not those
    negative = noised[:, :, 1]
    sized = (negative[..., 2:] - negative[..., :2] > 1e-3).all(-1, keepdim=True)
    inside = (negative > 1e-4) & (negative < 1 - 1e-4)
    assert (moved[:, :, 1][sized.expand_as(negative) & inside] >= 1 - 1e-3).all()


def test_a_batch_without_boxes_has_only_masked_padding():
    dn = denoising_queries(targets([0, 0]), SCALE, classes=5, groups=2)
    assert dn.real.sum() == 0 and dn.positive.sum() == 0
    assert torch.equal(dn.mask[:, 0], torch.eye(16, dtype=torch.bool).expand(2, 16, 16))
