"""What a dataset is once resolved: splits of samples, and the problems found on the way.

Boxes are ``xyxy`` normalised to ``[0, 1]`` of the (EXIF-oriented) image, ``float32``; labels
are contiguous class indices ``0..C-1``. Crowd regions (COCO ``iscrowd``) are kept apart: they
are ignore regions for evaluation and never training targets.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


class DataError(ValueError):
    """A dataset that cannot be used; the message says what is wrong and how to fix it."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the data, where it is, and what falconet does about it.

    ``action`` is ``skipped`` (the image is left out), ``dropped`` (one box or line is left
    out), ``clipped`` (a box was cut to the image), ``converted`` (the image is usable after a
    conversion, such as grayscale to RGB) or ``noted`` (nothing to do, worth knowing).
    """

    code: str
    path: str
    message: str
    action: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        return f"{where}: {self.message} [{self.code}, {self.action}]"


@dataclass(frozen=True)
class Sample:
    """One usable image and its targets."""

    image: Path
    image_id: int
    width: int
    height: int
    boxes: np.ndarray
    """``[n, 4]`` xyxy normalised, float32."""
    labels: np.ndarray
    """``[n]`` int64 contiguous class indices."""
    crowd: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))
    """``[m, 4]`` xyxy normalised crowd regions (ignored in training, ignore regions in eval)."""
    exif_oriented: bool = False
    """The file carries an EXIF orientation other than 1: its pixels are stored turned or
    mirrored, and its decoder must apply the orientation (``width`` and ``height`` are
    already as shown). OpenCV's and Pillow's decoders do; nvJPEG does not."""


@dataclass
class Split:
    """The usable samples of one split and every problem found while reading it."""

    name: str
    samples: list[Sample]
    problems: list[Problem]
    images_total: int

    @property
    def skipped(self) -> int:
        return self.images_total - len(self.samples)

    def summary(self) -> str:
        """One line of counts per problem, for the training log."""
        if not self.problems:
            return f"{self.name}: {len(self.samples)} images, no problems"
        counts = Counter((p.code, p.action) for p in self.problems)
        parts = ", ".join(f"{code} {n} ({action})" for (code, action), n in sorted(counts.items()))
        return (
            f"{self.name}: {len(self.samples)} of {self.images_total} images usable; "
            f"{parts}; run `falconet data check` for each file and line"
        )


@dataclass
class Dataset:
    """A resolved dataset: class names and its splits."""

    source: str
    names: list[str]
    splits: dict[str, Split]
    category_ids: list[int] | None = None
    """COCO category id of each contiguous class, when the labels came from COCO JSON."""

    @property
    def problems(self) -> list[Problem]:
        return [p for split in self.splits.values() for p in split.problems]

    def require_usable(self) -> None:
        """Refuse a dataset where a split has nothing left to train or validate on."""
        for split in self.splits.values():
            if not split.samples:
                codes = Counter(p.code for p in split.problems if p.action == "skipped")
                why = ", ".join(f"{code}: {n}" for code, n in codes.most_common()) or "no images"
                raise DataError(
                    f"data={self.source}: no usable image in {split.name} "
                    f"({split.images_total} found; {why}); run `falconet data "
                    f"check {self.source}` for each file"
                )


def xywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    out = boxes.astype(np.float64, copy=True)
    out[:, 2:] += out[:, :2]
    return out


def clip_boxes(xyxy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clip normalised boxes to ``[0, 1]``: (clipped boxes, was_clipped, is_empty_after)."""
    clipped = np.clip(xyxy, 0.0, 1.0)
    changed = (np.abs(clipped - xyxy) > 1e-6).any(axis=1)
    empty = (clipped[:, 2] <= clipped[:, 0]) | (clipped[:, 3] <= clipped[:, 1])
    return clipped, changed, empty


def as_boxes(rows: list[list[float]]) -> np.ndarray:
    return np.asarray(rows, dtype=np.float32).reshape(-1, 4)
