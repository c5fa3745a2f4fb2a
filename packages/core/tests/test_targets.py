"""The per-box view of a batch's targets and the padding of targets to a larger bucket."""

from __future__ import annotations

import torch

from falconet.data.targets import box_rows, fits, pad_targets, takes_box_rows, target_bucket


def padded_targets(counts: list[int], slots: int) -> dict[str, torch.Tensor]:
    boxes = torch.zeros(len(counts), slots, 4)
    labels = torch.zeros(len(counts), slots, dtype=torch.int64)
    for image, count in enumerate(counts):
        boxes[image, :count] = torch.arange(count * 4).view(count, 4) + 100 * image + 1
        labels[image, :count] = torch.arange(count) + 10 * image
    counts_t = torch.tensor(counts)
    images, box_slots = box_rows(counts_t)
    return {"boxes": boxes, "labels": labels, "counts": counts_t, "box_images": images,
            "box_slots": box_slots}  # fmt: skip


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
    real = targets["box_images"] < 4
    picked = targets["boxes"][targets["box_images"][real], targets["box_slots"][real]]
    per_image = [targets["boxes"][i, :n] for i, n in enumerate(targets["counts"].tolist())]
    assert torch.equal(picked, torch.cat(per_image))


def test_pad_targets_to_a_larger_bucket_keeps_every_box():
    targets = padded_targets([3, 0, 5, 1], 8)
    assert target_bucket(targets) == (8, 16)
    assert fits((8, 16), (8, 16)) and fits((8, 16), (16, 32))
    assert not fits((8, 16), (16, 8)) and not fits((8, 16), (8,))
    padded = pad_targets(targets, (16, 32))
    assert target_bucket(padded) == (16, 32)
    assert torch.equal(padded["boxes"][:, :8], targets["boxes"])
    assert padded["boxes"][:, 8:].abs().sum() == 0 and padded["labels"][:, 8:].abs().sum() == 0
    assert torch.equal(padded["counts"], targets["counts"])
    assert torch.equal(padded["box_images"][:16], targets["box_images"])
    assert padded["box_images"][16:].tolist() == [4] * 16  # rows of no image
    assert padded["box_slots"][16:].abs().sum() == 0
    assert pad_targets(targets, (8, 16))["boxes"] is targets["boxes"]  # already that bucket


def test_targets_without_the_per_box_view_pad_per_slot_only():
    targets = {k: v for k, v in padded_targets([2, 1], 8).items() if not k.startswith("box_")}
    assert target_bucket(targets) == (8,)
    padded = pad_targets(targets, (16,))
    assert padded["boxes"].shape == (2, 16, 4) and "box_images" not in padded


def test_takes_box_rows_reads_the_signature():
    class New:
        def __call__(self, scores, boxes, box_rows=None): ...

    class Old:
        def __call__(self, scores, boxes, anchor_strides=None): ...

    def open_ended(*args, **kwargs): ...

    assert takes_box_rows(New()) and takes_box_rows(open_ended)
    assert not takes_box_rows(Old()) and not takes_box_rows(max)  # max: no signature
