"""Image and box transforms on numpy arrays: letterbox, mosaic, random affine (with flip), HSV.

Images are ``[H, W, 3]`` uint8 RGB; boxes ``[n, 4]`` xyxy in pixels of that image, float32.
The geometry (mosaic placements, affine matrices, boxes through them) works on a batch of
samples at once, as arrays, and draws nothing: :mod:`falconet.data.plans` draws the random
parameters and hands them in. OpenCV does the pixel work (resize, warp, colour LUTs): measured
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
    shear: float = 0.0
    """Random shear range in degrees, along x and along y (drawn only when above 0)."""
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


def mosaic_placements(shapes: np.ndarray, centres: np.ndarray, size: int) -> np.ndarray:
    """Where each batch entry's four images go on its ``2 size`` canvas, around its centre.

    :param shapes: ``[B, 4, 2]`` ``(height, width)`` of the images (long side ``size``), in
        the order top left, top right, bottom left, bottom right.
    :param centres: ``[B, 2]`` integer ``(xc, yc)`` in ``[size / 2, 3 size / 2]``.
    :returns: ``[B, 4, 6]`` int64 :class:`MosaicLayout` placements.
    """
    h, w = shapes[..., 0], shapes[..., 1]
    xc, yc = centres[:, :1], centres[:, 1:]
    left = np.array([True, False, True, False])
    top = np.array([True, True, False, False])
    x1a = np.where(left, np.maximum(xc - w, 0), xc)
    x2a = np.where(left, xc, np.minimum(xc + w, 2 * size))
    y1a = np.where(top, np.maximum(yc - h, 0), yc)
    y2a = np.where(top, yc, np.minimum(yc + h, 2 * size))
    x1b = np.where(left, w - (x2a - x1a), 0)
    y1b = np.where(top, h - (y2a - y1a), 0)
    return np.stack((x1a, y1a, x2a, y2a, x1b, y1b), -1).astype(np.int64)


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


def affine_matrices(
    canvas: np.ndarray,
    size: int,
    angle: np.ndarray,
    gain: np.ndarray,
    shift: np.ndarray,
    flip: np.ndarray,
    shear: np.ndarray | None = None,
) -> np.ndarray:
    """Per batch entry: scale by ``gain`` and rotate by ``angle`` degrees (counter-clockwise,
    as ``cv2.getRotationMatrix2D``) around the centre of its ``canvas x canvas`` input, move
    that centre to ``shift`` (pixels of the ``size x size`` output), shear it there by
    ``shear`` (``[B, 2]`` degrees: x moves by ``tan(shear_x)`` per pixel of y, y by
    ``tan(shear_y)`` per pixel of x, around ``shift``), then mirror left-right where ``flip``:
    ``[B, 3, 3]`` float64, input pixels to output pixels."""
    radians = np.deg2rad(angle)
    alpha, beta = gain * np.cos(radians), gain * np.sin(radians)
    half = np.asarray(canvas, np.float64) / 2
    matrix = np.zeros((len(alpha), 3, 3))
    matrix[:, 0, 0], matrix[:, 0, 1] = alpha, beta
    matrix[:, 1, 0], matrix[:, 1, 1] = -beta, alpha
    matrix[:, 0, 2] = shift[:, 0] - (alpha + beta) * half
    matrix[:, 1, 2] = shift[:, 1] + (beta - alpha) * half
    matrix[:, 2, 2] = 1
    if shear is not None:
        slope = np.tan(np.deg2rad(shear))
        skew = np.tile(np.eye(3), (len(alpha), 1, 1))
        skew[:, 0, 1], skew[:, 1, 0] = slope[:, 0], slope[:, 1]
        skew[:, 0, 2], skew[:, 1, 2] = -slope[:, 0] * shift[:, 1], -slope[:, 1] * shift[:, 0]
        matrix = np.einsum("bij,bjk->bik", skew, matrix)  # no BLAS threads for 3 x 3 products
    matrix[flip, 0, :2] *= -1
    matrix[flip, 0, 2] = size - matrix[flip, 0, 2]
    return matrix


def warp_boxes(boxes: np.ndarray, matrices: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Boxes through their matrices (``[n, 3, 3]``, one per box: the box around each
    transformed box), clipped to the ``size`` output; returns the clipped boxes, float32, and
    which survive (at least 2 px and 10% of their transformed area visible), ``[n]`` bool."""
    corners = boxes[:, [0, 1, 2, 1, 2, 3, 0, 3]].reshape(-1, 4, 2).astype(np.float64)
    m = matrices[:, None, :2, :]  # [n, 1, 2, 3], written out: no BLAS threads for 2 x 2 products
    x, y = corners[..., 0], corners[..., 1]
    moved = np.stack([m[..., k, 0] * x + m[..., k, 1] * y + m[..., k, 2] for k in (0, 1)], -1)
    low, high = moved.min(1), moved.max(1)
    full_area = np.prod(high - low, 1)
    clipped = np.concatenate((low, high), 1).clip(0, size)
    bw, bh = clipped[:, 2] - clipped[:, 0], clipped[:, 3] - clipped[:, 1]
    keep = (bw > 2) & (bh > 2) & (bw * bh > 0.1 * np.maximum(full_area, 1e-9))
    return clipped.astype(np.float32), keep


def hsv_tables(gains: np.ndarray) -> np.ndarray:
    """The lookup tables of ``gains`` (``[..., 3]`` hue, saturation and value), ``[..., 3,
    256]`` uint8: hue wraps at 180 (OpenCV's 8-bit hue), saturation and value are clipped to
    255; both truncate."""
    x = np.arange(256, dtype=np.float32)
    scaled = np.asarray(gains, np.float64)[..., None] * x  # [..., 3, 256]
    scaled[..., 0, :] %= 180
    return np.clip(scaled, 0, 255).astype(np.uint8)


def apply_hsv(image: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """Hue, saturation and value scaled by ``gains`` through lookup tables."""
    hue, sat, val = cv2.split(cv2.cvtColor(image, cv2.COLOR_RGB2HSV))
    lut_h, lut_s, lut_v = hsv_tables(gains)
    # three plane lookups, not one 3-channel table: the table was slower
    # (tools/bench_augment.py; docs/lab/2026-11-cpu-loader.md has the measurement)
    merged = cv2.merge((cv2.LUT(hue, lut_h), cv2.LUT(sat, lut_s), cv2.LUT(val, lut_v)))
    return cv2.cvtColor(merged, cv2.COLOR_HSV2RGB)


def next_bucket(count: int, minimum: int = 8) -> int:
    """The padded box count for ``count`` boxes: the next power of two, at least ``minimum``."""
    return max(minimum, 1 << math.ceil(math.log2(max(count, 1))))
