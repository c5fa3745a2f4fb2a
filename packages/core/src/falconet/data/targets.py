"""The padded ground truth of a batch, and its bucket.

A batch's targets (``falconet.interfaces`` has the conventions) come in two views of the same
boxes, both static-shaped per bucket:

* per image: ``boxes [B, M, 4]``, ``labels [B, M]`` and ``counts [B]``, ``M`` the next power
  of two (at least 8) of the largest box count;
* per box: ``box_images [N]`` and ``box_slots [N]``, the image and the slot in ``boxes`` of
  every real box, ``N`` the next power of two of the batch's total box count, padded with
  image ``B`` (no image) and slot 0.

With mosaic, one image's box count is several times the mean, so most of ``[B, M]`` is padding
(on COCO128 at batch 16, ``M`` was 64 in half the batches measured, for 90-150 real boxes:
one slot in eight real), and an assigner that works per box (``tal``) does that much less
work; docs/performance.md has the measurements. The **bucket** of a batch is ``(M, N)``: a
graph backend records one graph per bucket and replays a batch in any recorded bucket at
least as large, padded up to it with :func:`pad_targets`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from falconet.data.transforms import next_bucket

TARGET_KEYS = ("boxes", "labels", "counts", "box_images", "box_slots")


def box_rows(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``box_images [N]`` and ``box_slots [N]`` for per-image box ``counts [B]``, padded to
    ``N = next_bucket(counts.sum())`` with image ``B`` and slot 0. Made on the host, where the
    counts are known, so no device code needs to look at them."""
    batch = len(counts)
    images = torch.repeat_interleave(torch.arange(batch), counts)
    starts = torch.cumsum(counts, 0) - counts  # each image's first row
    slots = torch.arange(len(images)) - starts[images] if len(images) else images
    pad = next_bucket(len(images)) - len(images)
    return (
        torch.cat((images, images.new_full((pad,), batch))),
        torch.cat((slots, slots.new_zeros(pad))),
    )


def target_bucket(targets: dict[str, torch.Tensor]) -> tuple[int, ...]:
    """``(M, N)`` of these targets (``(M,)`` for targets without the per-box view)."""
    bucket = (targets["boxes"].shape[1],)
    if "box_images" in targets:
        bucket += (targets["box_images"].shape[0],)
    return bucket


def fits(batch: tuple[int, ...], bucket: tuple[int, ...]) -> bool:
    """Whether targets of bucket ``batch`` can be padded up to ``bucket``."""
    return len(batch) == len(bucket) and all(b <= r for b, r in zip(batch, bucket, strict=True))


def pad_targets(
    targets: dict[str, torch.Tensor], bucket: tuple[int, ...]
) -> dict[str, torch.Tensor]:
    """The same targets in the larger ``bucket``: ``boxes``/``labels`` padded with zero slots
    to ``M``, ``box_images``/``box_slots`` with rows of no image to ``N`` (``counts``
    unchanged). Padding changes no loss: every assigner ignores slots past ``counts`` and rows
    of image ``B``."""
    m = targets["boxes"].shape[1]
    out = {k: targets[k] for k in TARGET_KEYS if k in targets}
    if bucket[0] > m:
        b = targets["boxes"].shape[0]
        out["boxes"] = torch.cat(
            (targets["boxes"], targets["boxes"].new_zeros(b, bucket[0] - m, 4)), 1
        )
        out["labels"] = torch.cat(
            (targets["labels"], targets["labels"].new_zeros(b, bucket[0] - m)), 1
        )
    if len(bucket) > 1 and bucket[1] > targets["box_images"].shape[0]:
        pad = bucket[1] - targets["box_images"].shape[0]
        images, slots = targets["box_images"], targets["box_slots"]
        out["box_images"] = torch.cat((images, images.new_full((pad,), targets["boxes"].shape[0])))
        out["box_slots"] = torch.cat((slots, slots.new_zeros(pad)))
    return out


def takes_box_rows(assigner: Callable) -> bool:
    """Whether ``assigner`` accepts ``box_rows`` (a parameter of that name or ``**kwargs``):
    an assigner written before the per-box view existed is called without it."""
    try:
        parameters = inspect.signature(assigner).parameters.values()
    except (TypeError, ValueError):  # a callable without an inspectable signature
        return False
    return any(p.name == "box_rows" or p.kind is p.VAR_KEYWORD for p in parameters)
