"""A training sample's augmentation as data: every random choice and every box, no pixels.

:func:`plan_sample` draws what the augmentation of one ``(epoch, index)`` will do (mosaic or
not and its partners, where each image lies on the canvas, the affine matrix with its flip,
the HSV gains) from ``numpy.random.default_rng([seed, epoch, index])``, in the order the loader
has always drawn them, and moves the boxes through it. The pixels are then made from the plan
by either path: the CPU loader (:meth:`falconet.data.loader.DetectionDataset.render`, OpenCV)
or the GPU one (:mod:`falconet.data.gpu_augment`, batched on the device). Both read one plan,
so their boxes are the same numbers, and their pixels differ only by interpolation rounding.

The **canvas** is what the affine matrix maps into the ``size x size`` output: with mosaic a
``2 size`` square holding four images around a random centre, without it the ``size`` square
of the letterboxed image. Each image on it is a :data:`Tile`; canvas pixels outside every tile
are grey (114), as is everything the matrix maps from outside the canvas.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from falconet.data.records import Sample
from falconet.data.transforms import (
    AugmentConfig,
    MosaicLayout,
    affine_matrix,
    hsv_gains,
    mosaic_boxes,
    mosaic_layout,
    warp_boxes,
)

Tile = tuple[int, int, int, int, int, int, int]
"""``(image, x1a, y1a, x2a, y2a, x1b, y1b)``: the canvas rectangle ``[x1a, x2a) x [y1a, y2a)``
shows image ``image`` (an index of the dataset, long side ``size``) from its pixel ``(x1b,
y1b)`` on."""


@dataclass(frozen=True)
class AugmentPlan:
    """One training sample's augmentation (module docstring).

    :param tiles: the images on the canvas (one without mosaic, four with it).
    :param canvas: the canvas's side in pixels (``size``, or ``2 size`` with mosaic).
    :param matrix: ``[3, 3]`` float64, canvas pixels to output pixels (flip included).
    :param gains: ``[3]`` float64 hue, saturation and value gains.
    :param boxes: ``[n, 4]`` float32 xyxy output pixels of the boxes that survive the warp.
    :param labels: ``[n]`` int64 their classes.
    :param layout: the mosaic layout (``None`` without mosaic), for the CPU's partial canvas.
    :param pad: ``(left, top)`` of the letterbox without mosaic.
    """

    tiles: tuple[Tile, ...]
    canvas: int
    matrix: np.ndarray
    gains: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    layout: MosaicLayout | None
    pad: tuple[float, float]

    @property
    def mosaic(self) -> bool:
        return self.layout is not None


Shape = Callable[[int], tuple[int, int]]
"""``shape(index) -> (height, width)`` of a dataset image with long side ``size``."""


def plan_sample(
    samples: Sequence[Sample],
    index: int,
    epoch: int,
    *,
    size: int,
    cfg: AugmentConfig,
    seed: int,
    shape: Shape,
    mosaic_on: bool = True,
) -> AugmentPlan:
    """The augmentation of ``samples[index]`` in ``epoch`` (module docstring)."""
    rng = np.random.default_rng([seed, epoch, index])

    def boxes_of(i: int) -> np.ndarray:
        h, w = shape(i)
        return samples[i].boxes * np.array([w, h, w, h], np.float32)

    if mosaic_on and cfg.mosaic > 0 and rng.random() < cfg.mosaic:
        others = rng.integers(0, len(samples), 3).tolist()
        members = [index, *others]
        layout = mosaic_layout([shape(i) for i in members], size, rng)
        labels = np.concatenate([samples[i].labels for i in members])
        flip = rng.random() < cfg.fliplr
        matrix = affine_matrix(2 * size, 2 * size, size, cfg, rng, flip=flip)
        boxes, keep = warp_boxes(mosaic_boxes(layout, [boxes_of(i) for i in members]), matrix, size)
        tiles = tuple((i, *p) for i, p in zip(members, layout.placements, strict=True))
        canvas, pad = 2 * size, (0.0, 0.0)
    else:
        h, w = shape(index)
        left, top = (size - w) // 2, (size - h) // 2
        boxes = boxes_of(index) + np.array([left, top, left, top], np.float32)
        labels = samples[index].labels
        flip = rng.random() < cfg.fliplr
        matrix = affine_matrix(size, size, size, cfg, rng, flip=flip)
        boxes, keep = warp_boxes(boxes, matrix, size)
        tiles = ((index, left, top, left + w, top + h, 0, 0),)
        canvas, pad, layout = size, (float(left), float(top)), None
    gains = hsv_gains(cfg, rng)
    return AugmentPlan(tiles, canvas, matrix, gains, boxes, labels[keep], layout, pad)
