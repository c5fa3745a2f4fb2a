"""The batched planner (:mod:`falconet.data.plans`) against the geometry written out per
sample (the mosaic quadrants case by case, the affine as a product of 3 x 3 matrices with
OpenCV's rotation, every box corner through it): on the same draws, the same tiles, matrices
and boxes."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from falconet.data.loader import resized_shape
from falconet.data.plans import Planner
from falconet.data.records import Sample
from falconet.data.transforms import AugmentConfig

SIZE = 160


def samples(count: int, seed: int = 0) -> list[Sample]:
    """Images of random sizes with 0-5 random boxes each (no files: the planner reads none)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        w, h = (int(v) for v in rng.integers(60, 400, 2))
        n = int(rng.integers(0, 6))
        corner = rng.uniform(0, 0.8, (n, 2))
        boxes = np.concatenate((corner, corner + rng.uniform(0.02, 0.2, (n, 2))), 1)
        out.append(Sample(None, i, w, h, boxes.astype(np.float32), rng.integers(0, 5, n)))
    return out


def quadrant(i: int, h: int, w: int, xc: int, yc: int, size: int) -> tuple[int, ...]:
    """Image ``i`` of a mosaic around ``(xc, yc)``, case by case."""
    if i == 0:
        x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
        return x1a, y1a, x2a, y2a, w - (x2a - x1a), h - (y2a - y1a)
    if i == 1:
        x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, 2 * size), yc
        return x1a, y1a, x2a, y2a, 0, h - (y2a - y1a)
    if i == 2:
        x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(yc + h, 2 * size)
        return x1a, y1a, x2a, y2a, w - (x2a - x1a), 0
    return xc, yc, min(xc + w, 2 * size), min(yc + h, 2 * size), 0, 0


def affine(canvas: int, angle: float, gain: float, shift, flip: bool, shear=None) -> np.ndarray:
    centre = np.eye(3)
    centre[:2, 2] = -canvas / 2
    rotate = np.eye(3)
    rotate[:2] = cv2.getRotationMatrix2D(center=(0, 0), angle=angle, scale=gain)
    move = np.eye(3)
    move[:2, 2] = shift
    matrix = move @ rotate @ centre
    if shear is not None:  # about the output point the canvas centre went to
        skew = np.eye(3)
        skew[0, 1], skew[1, 0] = np.tan(np.deg2rad(shear))
        back, there = np.eye(3), np.eye(3)
        back[:2, 2], there[:2, 2] = -np.asarray(shift), shift
        matrix = there @ skew @ back @ matrix
    if flip:
        mirror = np.diag([-1.0, 1.0, 1.0])
        mirror[0, 2] = SIZE
        matrix = mirror @ matrix
    return matrix


@pytest.mark.parametrize(("mosaic", "shear"), [(1.0, 0.0), (0.5, 0.0), (0.0, 0.0), (0.5, 10.0)])
def test_a_batch_plan_is_the_per_sample_geometry_of_its_draws(mosaic, shear):
    """With ``shear`` its angles are drawn last, so a run without it keeps its draws."""
    data = samples(12)
    cfg = AugmentConfig(mosaic=mosaic, degrees=15.0, shear=shear)
    shape = [resized_shape(s, SIZE) for s in data]
    planner = Planner(data, size=SIZE, cfg=cfg, seed=3, shape=shape.__getitem__)
    indices = [5, 0, 11, 3, 3, 7, 2, 9]
    plan = planner.plan(2, indices)
    # the draws, in the planner's order
    rng = np.random.default_rng([3, 2, *indices])
    on = rng.random(8) < mosaic
    partners = rng.integers(0, 12, (8, 3))
    centres = rng.uniform(SIZE * 0.5, SIZE * 1.5, (8, 2)).astype(int)
    flips = rng.random(8) < cfg.fliplr
    angles = rng.uniform(-15, 15, 8)
    gains = rng.uniform(1 - cfg.scale, 1 + cfg.scale, 8)
    shifts = rng.uniform(0.5 - cfg.translate, 0.5 + cfg.translate, (8, 2)) * SIZE
    hsv = rng.uniform(-1, 1, (8, 3)) * [cfg.hsv_h, cfg.hsv_s, cfg.hsv_v] + 1
    shears = rng.uniform(-shear, shear, (8, 2)) if shear else [None] * 8
    assert (plan.mosaic == on).all() and np.allclose(plan.gains, hsv)
    for b, index in enumerate(indices):
        one = plan.sample(b)
        if on[b]:
            members = [index, *partners[b].tolist()]
            tiles = [(m, *quadrant(i, *shape[m], *centres[b], SIZE)) for i, m in enumerate(members)]
            canvas = 2 * SIZE
        else:
            h, w = shape[index]
            left, top = (SIZE - w) // 2, (SIZE - h) // 2
            tiles, canvas = [(index, left, top, left + w, top + h, 0, 0)], SIZE
        assert one.tiles == tuple(tiles) and one.mosaic == on[b]
        matrix = affine(canvas, angles[b], gains[b], shifts[b], flips[b], shears[b])
        np.testing.assert_allclose(one.matrix, matrix, rtol=0, atol=1e-9)
        boxes, labels = [], []
        for image, x1a, y1a, _, _, x1b, y1b in tiles:
            h, w = shape[image]
            for box, label in zip(data[image].boxes, data[image].labels, strict=True):
                box = box * [w, h, w, h] + [x1a - x1b, y1a - y1b] * 2
                if on[b]:
                    box = box.clip(0, canvas)
                x0, y0, x1, y1 = box
                corners = np.array([[x0, y0, 1], [x1, y0, 1], [x1, y1, 1], [x0, y1, 1]])
                moved = corners @ matrix[:2].T
                low, high = moved.min(0), moved.max(0)
                clipped = np.r_[low, high].clip(0, SIZE)
                bw, bh = clipped[2] - clipped[0], clipped[3] - clipped[1]
                if bw > 2 and bh > 2 and bw * bh > 0.1 * max(np.prod(high - low), 1e-9):
                    boxes.append(clipped)
                    labels.append(label)
        np.testing.assert_allclose(one.boxes, np.reshape(boxes, (-1, 4)), rtol=0, atol=1e-3)
        assert one.labels.tolist() == labels


def test_the_plan_is_a_function_of_the_keys_and_close_mosaic_turns_mosaic_off():
    data = samples(6)
    shape = [resized_shape(s, SIZE) for s in data]
    planner = Planner(data, size=SIZE, cfg=AugmentConfig(), seed=0, shape=shape.__getitem__)
    a, b = planner.plan(1, [0, 4, 2]), planner.plan(1, [0, 4, 2])
    assert all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("tiles", "matrix", "boxes"))
    assert not np.array_equal(a.matrix, planner.plan(2, [0, 4, 2]).matrix)
    off = planner.plan(1, [0, 4, 2], mosaic_on=False)
    assert not off.mosaic.any() and (off.tiles[:, 1:, 0] == -1).all()
    inverse = off.inverse()  # output to canvas: undoes the matrix
    back = inverse[:, :, :2] @ off.matrix[:, :2, :2]
    np.testing.assert_allclose(back, np.broadcast_to(np.eye(2), back.shape), atol=1e-5)
