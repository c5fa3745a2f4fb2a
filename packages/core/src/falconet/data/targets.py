"""A batch's ground truth, typed: :class:`Targets`, padded and bucketed.

A batch's targets (``falconet.contract`` has the conventions) come in two views of the same
boxes, both static-shaped per bucket:

* per image: ``boxes [B, M, 4]``, ``labels [B, M]`` and ``counts [B]``, ``M`` the next power
  of two (at least 8) of the largest box count;
* per box: ``box_images [N]`` and ``box_slots [N]``, the image and the slot in ``boxes`` of
  every real box, ``N`` the next power of two of the batch's total box count, padded with
  image ``B`` (no image) and slot 0.

With mosaic, one image's box count is several times the mean, so most of ``[B, M]`` is
padding, and an assigner that works per box (``tal``) does that much less work
(docs/performance.md). The **bucket** of a batch is ``(M, N)``: a graph backend records one
graph per bucket and replays a batch in any recorded bucket at least as large (:func:`fits`),
padded up to it with :meth:`Targets.padded`. The loader yields dict batches under
:data:`TARGET_KEYS`; :meth:`Targets.from_batch` picks them out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np
import torch

from falconet.data.transforms import next_bucket

TARGET_KEYS = ("boxes", "labels", "counts", "box_images", "box_slots")


def box_rows(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``box_images [N]`` and ``box_slots [N]`` for per-image box ``counts [B]``, padded to
    ``N = next_bucket(counts.sum())`` with image ``B`` and slot 0. Made on the host, where the
    counts are known, so no device code needs to look at them; in numpy, because torch's CPU
    kernels, even on a few hundred numbers, wake its OpenMP pool, whose threads then spin on
    every core of the machine (docs/gpu-data.md has the measurement)."""
    counts = np.asarray(counts, np.int64)
    batch = len(counts)
    images = np.repeat(np.arange(batch), counts)
    starts = np.cumsum(counts) - counts  # each image's first row
    slots = np.arange(len(images)) - starts[images]
    pad = next_bucket(len(images)) - len(images)
    return (
        torch.from_numpy(np.concatenate((images, np.full(pad, batch)))),
        torch.from_numpy(np.concatenate((slots, np.zeros(pad, np.int64)))),
    )


def fits(batch: tuple[int, int], bucket: tuple[int, int]) -> bool:
    """Whether targets of bucket ``batch`` can be padded up to ``bucket`` (both ``(M, N)``)."""
    return len(batch) == len(bucket) and all(b <= r for b, r in zip(batch, bucket, strict=True))


@dataclass(frozen=True, eq=False)
class Targets:
    """The padded ground truth of a batch, in both views (module docstring).

    * ``boxes [B, M, 4]`` float32, xyxy pixels of the network input; slots past ``counts``
      are zeros;
    * ``labels [B, M]`` int64, class indices (0 past ``counts``);
    * ``counts [B]`` int64, the real boxes of each image;
    * ``box_images [N]`` int64, the image of each real box, ``B`` on padding rows;
    * ``box_slots [N]`` int64, its slot in ``boxes``/``labels``, 0 on padding rows.

    Every assigner and loss ignores slots past ``counts`` and rows of image ``B``, so padding
    changes no result. An assigner that works per slot simply ignores the per-box view.
    """

    boxes: torch.Tensor
    labels: torch.Tensor
    counts: torch.Tensor
    box_images: torch.Tensor
    box_slots: torch.Tensor

    @classmethod
    def from_batch(cls, batch: Mapping[str, torch.Tensor]) -> Targets:
        """The targets among a loader batch's keys (:data:`TARGET_KEYS`)."""
        return cls(*(batch[k] for k in TARGET_KEYS))

    @classmethod
    def from_padded(
        cls, boxes: torch.Tensor, labels: torch.Tensor, counts: torch.Tensor
    ) -> Targets:
        """Targets of per-image padded ``boxes [B, M, 4]``, ``labels [B, M]`` and ``counts
        [B]``, the per-box view made from ``counts`` on the host (:func:`box_rows`; reading
        counts that live on a GPU synchronises it, so the loader makes the view instead)."""
        images, slots = box_rows(counts.cpu())
        return cls(boxes, labels, counts, images.to(counts.device), slots.to(counts.device))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Targets:
        """The same targets on ``device``."""
        moved = (getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self))
        return Targets(*moved)

    @property
    def bucket(self) -> tuple[int, int]:
        """``(M, N)``: the slots per image and the rows of the per-box view."""
        return self.boxes.shape[1], self.box_images.shape[0]

    def padded(self, bucket: tuple[int, int]) -> Targets:
        """The same targets in the larger ``bucket`` (:func:`fits`): ``boxes``/``labels``
        padded with zero slots to ``M``, ``box_images``/``box_slots`` with rows of no image
        to ``N`` (``counts`` unchanged); a view that already has that size is kept as is."""
        (m, n), (to_m, to_n) = self.bucket, bucket
        boxes, labels, images, slots = self.boxes, self.labels, self.box_images, self.box_slots
        if to_m > m:
            b = boxes.shape[0]
            boxes = torch.cat((boxes, boxes.new_zeros(b, to_m - m, 4)), 1)
            labels = torch.cat((labels, labels.new_zeros(b, to_m - m)), 1)
        if to_n > n:
            images = torch.cat((images, images.new_full((to_n - n,), self.boxes.shape[0])))
            slots = torch.cat((slots, slots.new_zeros(to_n - n)))
        return Targets(boxes, labels, self.counts, images, slots)
