"""Targets: the per-box view of a batch's boxes, the bucket, and padding to a larger one."""

from __future__ import annotations

import torch

from falconet.data.targets import TARGET_KEYS, Targets, box_rows, fits


def padded_targets(counts: list[int], slots: int) -> Targets:
    boxes = torch.zeros(len(counts), slots, 4)
    labels = torch.zeros(len(counts), slots, dtype=torch.int64)
    for image, count in enumerate(counts):
        boxes[image, :count] = torch.arange(count * 4).view(count, 4) + 100 * image + 1
        labels[image, :count] = torch.arange(count) + 10 * image
    return Targets.from_padded(boxes, labels, torch.tensor(counts))


def test_box_rows_list_every_real_box_once_then_padding():
    images, slots = box_rows(torch.tensor([3, 0, 5, 1]))
    assert len(images) == 16  # 9 boxes: the next power of two
    assert images[:9].tolist() == [0, 0, 0, 2, 2, 2, 2, 2, 3]
    assert slots[:9].tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0]
    assert images[9:].tolist() == [4] * 7 and slots[9:].tolist() == [0] * 7  # image B: none
    empty_images, empty_slots = box_rows(torch.tensor([0, 0]))
    assert empty_images.tolist() == [2] * 8 and empty_slots.tolist() == [0] * 8


def test_the_rows_point_at_the_real_boxes():
    targets = padded_targets([3, 0, 5, 1], 8)
    real = targets.box_images < 4
    picked = targets.boxes[targets.box_images[real], targets.box_slots[real]]
    per_image = [targets.boxes[i, :n] for i, n in enumerate(targets.counts.tolist())]
    assert torch.equal(picked, torch.cat(per_image))


def test_from_batch_picks_the_loaders_keys():
    made = padded_targets([2, 1], 8)
    batch = {k: getattr(made, k) for k in TARGET_KEYS} | {"images": torch.zeros(2, 3, 8, 8)}
    targets = Targets.from_batch(batch)
    assert all(getattr(targets, k) is batch[k] for k in TARGET_KEYS)
    moved = targets.to("cpu", non_blocking=True)
    assert isinstance(moved, Targets) and torch.equal(moved.boxes, targets.boxes)


def test_padding_to_a_larger_bucket_keeps_every_box():
    targets = padded_targets([3, 0, 5, 1], 8)
    assert targets.bucket == (8, 16)
    assert fits((8, 16), (8, 16)) and fits((8, 16), (16, 32))
    assert not fits((8, 16), (16, 8)) and not fits((8, 16), (8,))
    padded = targets.padded((16, 32))
    assert padded.bucket == (16, 32)
    assert torch.equal(padded.boxes[:, :8], targets.boxes)
    assert padded.boxes[:, 8:].abs().sum() == 0 and padded.labels[:, 8:].abs().sum() == 0
    assert torch.equal(padded.counts, targets.counts)
    assert torch.equal(padded.box_images[:16], targets.box_images)
    assert padded.box_images[16:].tolist() == [4] * 16  # rows of no image
    assert padded.box_slots[16:].abs().sum() == 0
    same = targets.padded((8, 16))
    assert same.boxes is targets.boxes and same.box_images is targets.box_images
    wider = targets.padded((8, 32))  # one view grows, the other is kept
    assert wider.boxes is targets.boxes and wider.bucket == (8, 32)
