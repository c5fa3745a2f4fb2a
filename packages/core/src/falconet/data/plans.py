"""A batch's augmentation as data: every random choice and every box, no pixels.

:class:`Planner` draws what the augmentation of a batch of ``(epoch, index)`` keys will do
(mosaic or not and its partners, where each image lies on the canvas, the affine matrix with
its flip, the HSV gains) and moves the boxes through it, for the whole batch at once with
numpy, so one host thread plans faster than the GPU renders (docs/gpu-data.md has the loader's
measured rate and cores). The draws come from
``numpy.random.default_rng([seed, epoch, *indices])``: a function of the batch's keys, so
the same seed gives the same batches whatever the workers, ranks or resumes. The CPU loader
plans one sample at a time (its key alone seeds it).

The pixels are then made from the plan by either path: the CPU loader
(:meth:`falconet.data.loader.DetectionDataset.render`, OpenCV, one :class:`AugmentPlan` of
:meth:`BatchPlan.sample`) or the GPU one (:mod:`falconet.data.gpu_augment`, the whole batch
on the device). Both read one plan, so their boxes are the same numbers and their pixels
differ only by interpolation rounding.

The **canvas** is what the affine matrix maps into the ``size x size`` output: with mosaic a
``2 size`` square holding four images around a random centre, without it the ``size`` square
of the letterboxed image. Each image on it is a tile; canvas pixels outside every tile are grey
(114), as is everything the matrix maps from outside the canvas.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from falconet.data.records import Sample
from falconet.data.transforms import (
    AugmentConfig,
    MosaicLayout,
    affine_matrices,
    hsv_tables,
    mosaic_placements,
    warp_boxes,
)

TILES = 4
"""Tiles per canvas: a mosaic's four images (a letterboxed image uses the first)."""

Shape = Callable[[int], tuple[int, int]]
"""``shape(index) -> (height, width)`` of a dataset image with long side ``size``."""


@dataclass(frozen=True)
class AugmentPlan:
    """One training sample's augmentation (module docstring), as the CPU renders it.

    :param tiles: ``(image, x1a, y1a, x2a, y2a, x1b, y1b)`` per image on the canvas (one
        without mosaic, four with it): canvas rectangle ``[x1a, x2a) x [y1a, y2a)`` shows
        dataset image ``image`` from its pixel ``(x1b, y1b)`` on.
    :param matrix: ``[3, 3]`` float64, canvas pixels to output pixels (flip included).
    :param gains: ``[3]`` float64 hue, saturation and value gains.
    :param boxes: ``[n, 4]`` float32 xyxy output pixels of the boxes that survive the warp.
    :param labels: ``[n]`` int64 their classes.
    :param layout: the mosaic layout (``None`` without mosaic), for the CPU's partial canvas.
    """

    tiles: tuple[tuple[int, ...], ...]
    matrix: np.ndarray
    gains: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    layout: MosaicLayout | None

    @property
    def mosaic(self) -> bool:
        return self.layout is not None


@dataclass(frozen=True)
class BatchPlan:
    """A batch's augmentation (module docstring), ``B`` samples.

    :param tiles: ``[B, 4, 7]`` int64 tiles (:class:`AugmentPlan`), image ``-1`` where a
        canvas has fewer than four.
    :param mosaic: ``[B]`` bool.
    :param matrix: ``[B, 3, 3]`` float64, canvas pixels to output pixels.
    :param gains: ``[B, 3]`` float64.
    :param boxes: ``[n, 4]`` float32 surviving boxes of the whole batch, sample after sample.
    :param labels: ``[n]`` int64.
    :param counts: ``[B]`` int64 boxes per sample.
    """

    size: int
    tiles: np.ndarray
    mosaic: np.ndarray
    matrix: np.ndarray
    gains: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    counts: np.ndarray

    def __len__(self) -> int:
        return len(self.mosaic)

    def sample(self, b: int) -> AugmentPlan:
        """Entry ``b`` as one sample's plan."""
        start = int(self.counts[:b].sum())
        rows = slice(start, start + int(self.counts[b]))
        tiles = tuple(tuple(int(v) for v in t) for t in self.tiles[b] if t[0] >= 0)
        layout = MosaicLayout(self.size, tuple(t[1:] for t in tiles)) if self.mosaic[b] else None
        return AugmentPlan(
            tiles, self.matrix[b], self.gains[b], self.boxes[rows], self.labels[rows], layout
        )

    def inverse(self) -> np.ndarray:
        """``[B, 2, 3]`` float32: output pixels to canvas pixels (the matrices are affine)."""
        # written out, not np.linalg: LAPACK's threads would spin on the planning thread's cores
        (a, b, tx), (c, d, ty) = self.matrix[:, 0].T, self.matrix[:, 1].T
        det = a * d - b * c
        ia, ib, ic, id_ = d / det, -b / det, -c / det, a / det
        rows = (ia, ib, -(ia * tx + ib * ty)), (ic, id_, -(ic * tx + id_ * ty))
        return np.stack([np.stack(row, 1) for row in rows], 1).astype(np.float32)

    def tables(self) -> np.ndarray:
        """``[B, 3, 256]`` uint8 hue, saturation and value lookup tables."""
        return hsv_tables(self.gains)


class Planner:
    """Plans batches of one dataset's samples (module docstring); holds the samples' sizes
    and boxes as flat arrays, so a batch's plan is array arithmetic."""

    def __init__(
        self,
        samples: Sequence[Sample],
        *,
        size: int,
        cfg: AugmentConfig,
        seed: int,
        shape: Shape,
    ) -> None:
        self.size, self.cfg, self.seed = size, cfg, seed
        self.shapes = np.array([shape(i) for i in range(len(samples))], np.int64).reshape(-1, 2)
        counts = np.array([len(s.labels) for s in samples], np.int64)
        self.starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        self.box_counts = counts
        self.boxes = np.concatenate([s.boxes.reshape(-1, 4) for s in samples] or [np.zeros((0, 4))])
        self.boxes = self.boxes.astype(np.float32)
        self.labels = np.concatenate([s.labels for s in samples] or [np.zeros(0)]).astype(np.int64)

    def drop_boxes(self, image: int) -> None:
        """Plan ``image`` without boxes from now on (its file no longer decodes: it is drawn
        grey); every draw stays as it was, so a plan made again differs only in its boxes."""
        self.box_counts[image] = 0

    def plan(
        self,
        epoch: int,
        indices: Sequence[int],
        *,
        mosaic_on: bool = True,
        pool: np.ndarray | None = None,
    ) -> BatchPlan:
        """The augmentation of samples ``indices`` in ``epoch``. A mosaic's partners are drawn
        from the whole dataset, or from ``pool`` (dataset indices) where it is given: the images
        a decoding loader holds decoded (:mod:`falconet.data.gpu_decode`). The draws are the
        same numbers either way; only what a partner draw picks from differs."""
        cfg, size = self.cfg, self.size
        index = np.asarray(indices, np.int64)
        batch = len(index)
        rng = np.random.default_rng([self.seed, epoch, *index.tolist()])
        mosaic = rng.random(batch) < cfg.mosaic
        if not (mosaic_on and cfg.mosaic > 0):
            mosaic[:] = False
        if pool is None:
            partners = rng.integers(0, len(self.shapes), (batch, TILES - 1))
        else:
            partners = np.asarray(pool, np.int64)[rng.integers(0, len(pool), (batch, TILES - 1))]
        centres = rng.uniform(size * 0.5, size * 1.5, (batch, 2)).astype(np.int64)
        flip = rng.random(batch) < cfg.fliplr
        angle = rng.uniform(-cfg.degrees, cfg.degrees, batch)
        gain = rng.uniform(1 - cfg.scale, 1 + cfg.scale, batch)
        shift = rng.uniform(0.5 - cfg.translate, 0.5 + cfg.translate, (batch, 2)) * size
        gains = rng.uniform(-1, 1, (batch, 3)) * [cfg.hsv_h, cfg.hsv_s, cfg.hsv_v] + 1
        # drawn last, and only when asked for: runs without shear keep the draws they had
        shear = rng.uniform(-cfg.shear, cfg.shear, (batch, 2)) if cfg.shear > 0 else None

        members = np.concatenate((index[:, None], partners), 1)  # [B, 4]
        tiles = np.zeros((batch, TILES, 7), np.int64)
        tiles[:, :, 0] = np.where(mosaic[:, None], members, -1)
        tiles[:, :, 1:] = mosaic_placements(self.shapes[members], centres, size)
        tiles[~mosaic, :, 1:] = 0
        h, w = self.shapes[index].T
        left, top = (size - w) // 2, (size - h) // 2
        letterboxed = np.stack((index, left, top, left + w, top + h, 0 * h, 0 * h), 1)
        tiles[~mosaic, 0] = letterboxed[~mosaic]
        canvas = np.where(mosaic, 2 * size, size)
        matrix = affine_matrices(canvas, size, angle, gain, shift, flip, shear)
        boxes, labels, owner = self._tile_boxes(tiles, mosaic)
        boxes, keep = warp_boxes(boxes, matrix[owner], size)
        return BatchPlan(
            size,
            tiles,
            mosaic,
            matrix,
            gains,
            boxes[keep],
            labels[keep],
            np.bincount(owner[keep], minlength=batch).astype(np.int64),
        )

    def _tile_boxes(
        self, tiles: np.ndarray, mosaic: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every tile's boxes in canvas pixels (a mosaic's clipped to its canvas), their
        labels and the batch entry of each, sample after sample and tile after tile."""
        image = tiles[:, :, 0].reshape(-1)
        present = image >= 0
        image, placement = image[present], tiles[:, :, 1:].reshape(-1, 6)[present]
        entry = np.repeat(np.arange(len(tiles)), TILES)[present]
        counts = self.box_counts[image]
        rows = np.repeat(self.starts[image] - np.cumsum(counts) + counts, counts)
        rows += np.arange(len(rows))
        tile_of = np.repeat(np.arange(len(image)), counts)
        h, w = self.shapes[image].T
        x1a, y1a, _, _, x1b, y1b = placement.T
        scale = np.stack((w, h, w, h), 1)[tile_of].astype(np.float32)
        offset = np.stack((x1a - x1b, y1a - y1b) * 2, 1)[tile_of].astype(np.float32)
        boxes = self.boxes[rows] * scale + offset
        on_mosaic = mosaic[entry[tile_of]]
        boxes[on_mosaic] = boxes[on_mosaic].clip(0, 2 * self.size)
        return boxes, self.labels[rows], entry[tile_of]
