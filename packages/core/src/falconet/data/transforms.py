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


def mosaic(
    images: list[np.ndarray], boxes: list[np.ndarray], size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Four images (long side ``size``) around a random centre of a ``2 size`` canvas.

    Returns the canvas and the boxes moved into it, in the order of ``images``.
    """
    canvas = np.full((2 * size, 2 * size, 3), PAD_VALUE, np.uint8)
    xc, yc = (int(v) for v in rng.uniform(size * 0.5, size * 1.5, 2))
    moved = []
    for i, (image, box) in enumerate(zip(images, boxes, strict=True)):
        h, w = image.shape[:2]
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
        canvas[y1a:y2a, x1a:x2a] = image[y1b : y1b + (y2a - y1a), x1b : x1b + (x2a - x1a)]
        shift = np.array([x1a - x1b, y1a - y1b] * 2, np.float32)
        moved.append(box + shift)
    boxes_out = np.concatenate(moved) if moved else np.zeros((0, 4), np.float32)
    return canvas, np.clip(boxes_out, 0, 2 * size)  # an image may overhang the canvas edge


def random_affine(
    image: np.ndarray,
    boxes: np.ndarray,
    size: int,
    cfg: AugmentConfig,
    rng: np.random.Generator,
    *,
    flip: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scale, rotate and translate around the centre into a ``size x size`` output, mirrored
    left-right when ``flip`` (folded into the same warp: no extra pass over the pixels).

    Returns the image, the transformed boxes that survive (clipped, and at least 2 px and 10%
    of their transformed area visible) and the indices of those boxes in the input.
    """
    h, w = image.shape[:2]
    centre = np.eye(3)
    centre[0, 2], centre[1, 2] = -w / 2, -h / 2
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
    out = cv2.warpAffine(
        image, matrix[:2], dsize=(size, size), borderValue=(PAD_VALUE, PAD_VALUE, PAD_VALUE)
    )
    if not len(boxes):
        return out, np.zeros((0, 4), np.float32), np.zeros(0, np.int64)
    corners = boxes[:, [0, 1, 2, 1, 2, 3, 0, 3]].reshape(-1, 2)  # 4 corners per box
    corners = np.c_[corners, np.ones(len(corners))] @ matrix[:2].T
    corners = corners.reshape(-1, 8)
    xs, ys = corners[:, 0::2], corners[:, 1::2]
    moved = np.stack([xs.min(1), ys.min(1), xs.max(1), ys.max(1)], axis=1)
    full_area = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
    clipped = moved.clip(0, size)
    bw, bh = clipped[:, 2] - clipped[:, 0], clipped[:, 3] - clipped[:, 1]
    keep = (bw > 2) & (bh > 2) & (bw * bh > 0.1 * np.maximum(full_area, 1e-9))
    return out, clipped[keep].astype(np.float32), np.flatnonzero(keep)


def augment_hsv(image: np.ndarray, cfg: AugmentConfig, rng: np.random.Generator) -> np.ndarray:
    """Random hue, saturation and value gains, applied through lookup tables."""
    gains = rng.uniform(-1, 1, 3) * [cfg.hsv_h, cfg.hsv_s, cfg.hsv_v] + 1
    hue, sat, val = cv2.split(cv2.cvtColor(image, cv2.COLOR_RGB2HSV))
    x = np.arange(256, dtype=np.float32)
    lut_h = ((x * gains[0]) % 180).astype(np.uint8)
    lut_s = np.clip(x * gains[1], 0, 255).astype(np.uint8)
    lut_v = np.clip(x * gains[2], 0, 255).astype(np.uint8)
    merged = cv2.merge((cv2.LUT(hue, lut_h), cv2.LUT(sat, lut_s), cv2.LUT(val, lut_v)))
    return cv2.cvtColor(merged, cv2.COLOR_HSV2RGB)


def next_bucket(count: int, minimum: int = 8) -> int:
    """The padded box count for ``count`` boxes: the next power of two, at least ``minimum``."""
    return max(minimum, 1 << math.ceil(math.log2(max(count, 1))))
