"""The mosaic warp that builds only the canvas region it samples gives what warping the whole
canvas gives."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from falconet.data.transforms import (
    PAD_VALUE,
    AugmentConfig,
    MosaicLayout,
    affine_matrices,
    mosaic_canvas,
    mosaic_placements,
    warp_mosaic,
)


def random_mosaic(
    images: list[np.ndarray], size: int, cfg: AugmentConfig, rng: np.random.Generator, flip: bool
) -> tuple[MosaicLayout, np.ndarray]:
    """A layout of ``images`` around a random centre and a random affine of its canvas."""
    shapes = np.array([[im.shape[:2] for im in images]])
    centre = rng.uniform(size * 0.5, size * 1.5, (1, 2)).astype(np.int64)
    layout = MosaicLayout(size, tuple(map(tuple, mosaic_placements(shapes, centre, size)[0])))
    matrix = affine_matrices(
        np.array([2 * size]),
        size,
        rng.uniform(-cfg.degrees, cfg.degrees, 1),
        rng.uniform(1 - cfg.scale, 1 + cfg.scale, 1),
        rng.uniform(0.5 - cfg.translate, 0.5 + cfg.translate, (1, 2)) * size,
        np.array([flip]),
    )[0]
    return layout, matrix


def tiles(rng: np.random.Generator, size: int) -> list[np.ndarray]:
    """Four images with long side ``size`` and random short sides, of smooth random content
    (bilinear rounding shows on smooth gradients as on real photos)."""
    out = []
    for _ in range(4):
        h, w = (size, int(rng.integers(size // 3, size + 1)))[:: int(rng.choice([1, -1]))]
        small = rng.integers(0, 256, (max(h // 16, 2), max(w // 16, 2), 3), dtype=np.uint8)
        out.append(cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR))
    return out


@pytest.mark.parametrize("degrees", [0.0, 10.0])
def test_warping_the_sampled_region_equals_warping_the_whole_canvas(degrees):
    size = 160
    cfg = AugmentConfig(degrees=degrees, scale=0.5, translate=0.1)
    differing = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        images = tiles(rng, size)
        layout, matrix = random_mosaic(images, size, cfg, rng, flip=bool(seed % 2))
        whole = cv2.warpAffine(
            mosaic_canvas(images, layout, (0, 0, 2 * size, 2 * size)),
            matrix[:2],
            dsize=(size, size),
            borderValue=(PAD_VALUE,) * 3,
        )
        region = warp_mosaic(images, layout, matrix)
        diff = np.abs(whole.astype(int) - region.astype(int))
        assert diff.max() <= 1, seed  # OpenCV's fixed-point rounding of the shifted matrix
        differing += int((diff > 0).sum())
    assert differing <= 1e-3 * 60 * size * size * 3  # and rarely even that


def test_an_output_that_sees_no_canvas_is_grey():
    size = 64
    rng = np.random.default_rng(0)
    images = tiles(rng, size)
    layout, _ = random_mosaic(images, size, AugmentConfig(), rng, flip=False)
    far = np.array([[1, 0, 10 * size], [0, 1, 10 * size], [0, 0, 1]], np.float64)
    assert (warp_mosaic(images, layout, far) == PAD_VALUE).all()
