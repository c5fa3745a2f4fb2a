"""Image and box transforms on numpy arrays: letterbox, mosaic, random affine (with flip), HSV.

Images are ``[H, W, 3]`` uint8 RGB; boxes ``[n, 4]`` xyxy in pixels of that image, float32.
Every random choice comes from the ``rng`` passed in, so one seed gives one result whatever
process or worker runs it. OpenCV does the pixel work (resize, warp, colour LUTs): measured
faster than Pillow for decoding here (docs/data.md), and the library YOLO pipelines use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

PAD_VALUE = 114


@dataclass(frozen=True)
class AugmentConfig:
    """Training augmentation, with the YOLO family's defaults."""

    mosaic: float = 1.0
    """Probability of a 4-image mosaic."""
    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    """Random scale gain in ``[1 - scale, 1 + scale]``."""
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    fliplr: float = 0.5


def read_image(path: str) -> np.ndarray:
    """Decode to ``[H, W, 3]`` uint8 RGB, EXIF orientation applied, any mode converted.

    ``cv2.IMREAD_COLOR`` applies EXIF orientation and converts grayscale, palette, alpha and
    16-bit images to 8-bit colour, matching what ``falconet data check`` reports.
    """
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None:
        raise OSError(f"cannot decode {path}")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def resize_long_side(image: np.ndarray, size: int) -> np.ndarray:
    """Resize so the long side is ``size`` (area interpolation when shrinking)."""
    h, w = image.shape[:2]
    ratio = size / max(h, w)
    if ratio == 1:
        return image
    interp = cv2.INTER_AREA if ratio < 1 else cv2.INTER_LINEAR
    return cv2.resize(
        image, (max(1, round(w * ratio)), max(1, round(h * ratio))), interpolation=interp
    )


def letterbox(image: np.ndarray, size: int) -> tuple[np.ndarray, float, tuple[float, float]]:
    """Fit into ``size x size`` keeping the aspect ratio, padded with grey; returns the image,
    the scale applied and the ``(left, top)`` padding, to map boxes back to the original."""
    h, w = image.shape[:2]
    ratio = size / max(h, w)
    resized = resize_long_side(image, size)
    rh, rw = resized.shape[:2]
    left, top = (size - rw) // 2, (size - rh) // 2
    out = np.full((size, size, 3), PAD_VALUE, np.uint8)
    out[top : top + rh, left : left + rw] = resized
    return out, ratio, (float(left), float(top))


@dataclass(frozen=True)
class MosaicLayout:
    """Where four images go on a ``2 size`` canvas around a centre: per image
    ``(x1a, y1a, x2a, y2a, x1b, y1b)``, the canvas rectangle and the image's top-left corner
    of the part placed there."""

    size: int
    placements: tuple[tuple[int, int, int, int, int, int], ...]


def mosaic_layout(
    shapes: list[tuple[int, int]], size: int, rng: np.random.Generator
) -> MosaicLayout:
    """Four images of ``(height, width)`` (long side ``size``) around a random centre of a
    ``2 size`` canvas (top left, top right, bottom left, bottom right)."""
    xc, yc = (int(v) for v in rng.uniform(size * 0.5, size * 1.5, 2))
    placements = []
    for i, (h, w) in enumerate(shapes):
        if i == 0:  # top left
            x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
            x1b, y1b = w - (x2a - x1a), h - (y2a - y1a)
        elif i == 1:  # top right
            x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, 2 * size), yc
            x1b, y1b = 0, h - (y2a - y1a)
        elif i == 2:  # bottom left
            x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(yc + h, 2 * size)
            x1b, y1b = w - (x2a - x1a), 0
        else:  # bottom right
            x1a, y1a, x2a, y2a = xc, yc, min(xc + w, 2 * size), min(yc + h, 2 * size)
            x1b, y1b = 0, 0
        placements.append((x1a, y1a, x2a, y2a, x1b, y1b))
    return MosaicLayout(size, tuple(placements))


def mosaic_boxes(layout: MosaicLayout, boxes: list[np.ndarray]) -> np.ndarray:
    """Each image's boxes moved onto the canvas (clipped to it: an image may overhang)."""
    moved = [
        box + np.array([x1a - x1b, y1a - y1b] * 2, np.float32)
        for (x1a, y1a, _, _, x1b, y1b), box in zip(layout.placements, boxes, strict=True)
    ]
    out = np.concatenate(moved) if moved else np.zeros((0, 4), np.float32)
    return np.clip(out, 0, 2 * layout.size)


def mosaic_canvas(
    images: list[np.ndarray], layout: MosaicLayout, region: tuple[int, int, int, int]
) -> np.ndarray:
    """The part ``(x0, y0, x1, y1)`` of the grey canvas with the images placed on it."""
    x0, y0, x1, y1 = region
    canvas = np.full((y1 - y0, x1 - x0, 3), PAD_VALUE, np.uint8)
    for image, (x1a, y1a, x2a, y2a, x1b, y1b) in zip(images, layout.placements, strict=True):
        ax1, ay1, ax2, ay2 = max(x1a, x0), max(y1a, y0), min(x2a, x1), min(y2a, y1)
        if ax2 <= ax1 or ay2 <= ay1:
            continue  # this image lies outside the region
        bx, by = x1b + ax1 - x1a, y1b + ay1 - y1a
        canvas[ay1 - y0 : ay2 - y0, ax1 - x0 : ax2 - x0] = image[
            by : by + ay2 - ay1, bx : bx + ax2 - ax1
        ]
    return canvas


def warp_mosaic(images: list[np.ndarray], layout: MosaicLayout, matrix: np.ndarray) -> np.ndarray:
    """The mosaic warped by ``matrix`` (canvas to ``size x size`` output), building only the
    part of the canvas the warp samples (plus a margin for the bilinear neighbours): about a
    quarter of it at scale 1, so the fill and the copies cost a quarter. The result equals
    warping the whole canvas up to OpenCV's fixed-point rounding of the shifted matrix (rare
    pixels differ by one level; tested)."""
    size, full = layout.size, 2 * layout.size
    corners = np.array([[0, 0, 1], [size, 0, 1], [0, size, 1], [size, size, 1]], np.float64)
    source = corners @ np.linalg.inv(matrix)[:2].T
    x0, y0 = (max(int(np.floor(v)) - MARGIN, 0) for v in source.min(0))
    x1, y1 = (min(int(np.ceil(v)) + MARGIN, full) for v in source.max(0))
    if x1 <= x0 or y1 <= y0:  # the output sees none of the canvas
        return np.full((size, size, 3), PAD_VALUE, np.uint8)
    shifted = matrix @ np.array([[1, 0, x0], [0, 1, y0], [0, 0, 1]], np.float64)
    return cv2.warpAffine(
        mosaic_canvas(images, layout, (x0, y0, x1, y1)),
        shifted[:2],
        dsize=(size, size),
        borderValue=(PAD_VALUE, PAD_VALUE, PAD_VALUE),
    )


MARGIN = 2
"""Pixels of canvas kept around the sampled region: bilinear reads one neighbour."""


def affine_matrix(
    width: int,
    height: int,
    size: int,
    cfg: AugmentConfig,
    rng: np.random.Generator,
    *,
    flip: bool = False,
) -> np.ndarray:
    """Scale, rotate and translate around the centre of a ``width x height`` input into a
    ``size x size`` output, mirrored left-right when ``flip``: the ``3 x 3`` matrix."""
    centre = np.eye(3)
    centre[0, 2], centre[1, 2] = -width / 2, -height / 2
    rotate = np.eye(3)
    angle = rng.uniform(-cfg.degrees, cfg.degrees)
    gain = rng.uniform(1 - cfg.scale, 1 + cfg.scale)
    rotate[:2] = cv2.getRotationMatrix2D(angle=angle, center=(0, 0), scale=gain)
    shift = np.eye(3)
    shift[0, 2] = rng.uniform(0.5 - cfg.translate, 0.5 + cfg.translate) * size
    shift[1, 2] = rng.uniform(0.5 - cfg.translate, 0.5 + cfg.translate) * size
    matrix = shift @ rotate @ centre
    if flip:
        mirror = np.eye(3)
        mirror[0, 0], mirror[0, 2] = -1, size
        matrix = mirror @ matrix
    return matrix


def warp_boxes(boxes: np.ndarray, matrix: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Boxes through ``matrix`` (the box around each transformed box), clipped to the output;
    those that survive (at least 2 px and 10% of their transformed area visible) and their
    indices in the input."""
    if not len(boxes):
        return np.zeros((0, 4), np.float32), np.zeros(0, np.int64)
    corners = boxes[:, [0, 1, 2, 1, 2, 3, 0, 3]].reshape(-1, 2)  # 4 corners per box
    corners = np.c_[corners, np.ones(len(corners))] @ matrix[:2].T
    corners = corners.reshape(-1, 8)
    xs, ys = corners[:, 0::2], corners[:, 1::2]
    moved = np.stack([xs.min(1), ys.min(1), xs.max(1), ys.max(1)], axis=1)
    full_area = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
    clipped = moved.clip(0, size)
    bw, bh = clipped[:, 2] - clipped[:, 0], clipped[:, 3] - clipped[:, 1]
    keep = (bw > 2) & (bh > 2) & (bw * bh > 0.1 * np.maximum(full_area, 1e-9))
    return clipped[keep].astype(np.float32), np.flatnonzero(keep)


def random_affine(
    image: np.ndarray,
    boxes: np.ndarray,
    size: int,
    cfg: AugmentConfig,
    rng: np.random.Generator,
    *,
    flip: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`affine_matrix` applied to ``image`` and its boxes (the flip folded into the same
    warp: no extra pass over the pixels). Returns the image, the surviving boxes and their
    indices in the input."""
    h, w = image.shape[:2]
    matrix = affine_matrix(w, h, size, cfg, rng, flip=flip)
    out = cv2.warpAffine(
        image, matrix[:2], dsize=(size, size), borderValue=(PAD_VALUE, PAD_VALUE, PAD_VALUE)
    )
    return (out, *warp_boxes(boxes, matrix, size))


def augment_hsv(image: np.ndarray, cfg: AugmentConfig, rng: np.random.Generator) -> np.ndarray:
    """Random hue, saturation and value gains, applied through lookup tables."""
    return apply_hsv(image, hsv_gains(cfg, rng))


def hsv_gains(cfg: AugmentConfig, rng: np.random.Generator) -> np.ndarray:
    """The random ``(hue, saturation, value)`` gains, ``[3]`` float64."""
    return rng.uniform(-1, 1, 3) * [cfg.hsv_h, cfg.hsv_s, cfg.hsv_v] + 1


def hsv_tables(gains: np.ndarray) -> np.ndarray:
    """The lookup tables of ``gains``, ``[3, 256]`` uint8: hue wraps at 180 (OpenCV's 8-bit
    hue), saturation and value are clipped to 255; both truncate."""
    x = np.arange(256, dtype=np.float32)
    return np.stack(
        [
            ((x * gains[0]) % 180).astype(np.uint8),
            np.clip(x * gains[1], 0, 255).astype(np.uint8),
            np.clip(x * gains[2], 0, 255).astype(np.uint8),
        ]
    )


def apply_hsv(image: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """Hue, saturation and value scaled by ``gains`` through lookup tables."""
    hue, sat, val = cv2.split(cv2.cvtColor(image, cv2.COLOR_RGB2HSV))
    lut_h, lut_s, lut_v = hsv_tables(gains)
    # three plane lookups, not one 3-channel table: the table was slower
    # (tools/bench_augment.py; docs/data.md has the measurement)
    merged = cv2.merge((cv2.LUT(hue, lut_h), cv2.LUT(sat, lut_s), cv2.LUT(val, lut_v)))
    return cv2.cvtColor(merged, cv2.COLOR_HSV2RGB)


def next_bucket(count: int, minimum: int = 8) -> int:
    """The padded box count for ``count`` boxes: the next power of two, at least ``minimum``."""
    return max(minimum, 1 << math.ceil(math.log2(max(count, 1))))
