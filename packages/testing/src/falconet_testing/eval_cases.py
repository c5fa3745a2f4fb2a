"""Evaluation cases for the parity contract: real COCO ground truth, generated detections.

The ground truth is COCO128's real annotations (bounding boxes, crowd regions included), shipped
with this package so a third-party backend runs the same cases with no download. Detections are
generated from it, seeded, with what a real detector produces: jittered true positives, misses,
duplicates, false positives, class swaps, hits on crowd regions and tied scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from importlib.resources import files

import numpy as np

from falconet.evaluation.coco_json import load_ground_truth
from falconet.evaluation.contract import Detections, GroundTruth

COCO128_BBOX_JSON = files("falconet_testing") / "data" / "coco128_instances_bbox.json"
"""COCO128's instances file, bounding boxes only (see data/NOTICE.md)."""


def coco128_ground_truth() -> GroundTruth:
    """COCO128's real ground truth: 128 images, 939 boxes (10 crowd), 80 categories (71 used)."""
    return load_ground_truth(COCO128_BBOX_JSON)


def generated_detections(gt: GroundTruth, seed: int, *, tie_step: float = 0.05) -> Detections:
    """About 10-20 detections per image, shaped like a detector's output."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[int, int, np.ndarray, float]] = []
    sizes = dict(zip(gt.image_ids.tolist(), gt.image_sizes.tolist(), strict=True))
    for image_id, cat, box, crowd in zip(
        gt.ann_image_ids.tolist(),
        gt.ann_category_ids.tolist(),
        gt.ann_boxes,
        gt.ann_iscrowd.tolist(),
        strict=True,
    ):
        if rng.random() < 0.15:  # a miss
            continue
        for copy in range(1 + (rng.random() < 0.2)):  # sometimes a duplicate
            jitter = rng.normal(0.0, 0.08 if not crowd else 0.2, 4) * np.r_[box[2:], box[2:]]
            new = box + jitter
            new[2:] = np.maximum(new[2:], 0.0)
            label = cat if rng.random() > 0.1 else int(rng.choice(gt.category_ids))  # swap
            rows.append((image_id, label, new, rng.random() * (0.5 if copy else 1.0)))
    for image_id in gt.image_ids.tolist():  # false positives, including on empty images
        height, width = sizes[image_id]
        for _ in range(int(rng.integers(2, 8))):
            w, h = rng.uniform(2, width / 2), rng.uniform(2, height / 2)
            xy = rng.uniform(0, 1, 2) * [width - w, height - h]
            rows.append(
                (image_id, int(rng.choice(gt.category_ids)), np.r_[xy, w, h], rng.random() * 0.6)
            )
    order = rng.permutation(len(rows))  # input order matters for ties: shuffle it
    scores = np.array([rows[i][3] for i in order])
    tied = rng.random(len(scores)) < 0.5
    scores[tied] = np.round(scores[tied] / tie_step) * tie_step  # many exact ties
    return Detections(
        image_ids=[rows[i][0] for i in order],
        category_ids=[rows[i][1] for i in order],
        boxes=np.stack([rows[i][2] for i in order]),
        scores=scores,
    )


def with_empty_images(gt: GroundTruth, count: int = 5) -> GroundTruth:
    """``gt`` plus ``count`` images that have no annotations."""
    new_ids = gt.image_ids.max() + 1 + np.arange(count)
    return replace(
        gt,
        image_ids=np.r_[gt.image_ids, new_ids],
        image_sizes=np.r_[gt.image_sizes, np.tile([[480, 640]], (count, 1))],
    )


def with_zero_size_boxes(gt: GroundTruth) -> GroundTruth:
    """``gt`` with every 7th box collapsed to zero width and every 11th to zero height."""
    boxes = gt.ann_boxes.copy()
    boxes[::7, 2] = 0.0
    boxes[::11, 3] = 0.0
    return replace(gt, ann_boxes=boxes, ann_areas=boxes[:, 2] * boxes[:, 3])


def _on_empty_images(gt: GroundTruth, seed: int) -> Detections:
    dets = generated_detections(gt, seed)
    empty = np.setdiff1d(gt.image_ids, gt.ann_image_ids)
    extra = Detections(
        image_ids=np.repeat(empty, 3),
        category_ids=np.full(3 * len(empty), 1),
        boxes=np.tile([[10.0, 10.0, 50.0, 40.0]], (3 * len(empty), 1)),
        scores=np.linspace(0.9, 0.1, 3 * len(empty)),
    )
    return _concat(dets, extra)


def _zero_size_detections(gt: GroundTruth, seed: int) -> Detections:
    dets = generated_detections(gt, seed)
    boxes = dets.boxes.copy()
    boxes[::5, 2] = 0.0
    boxes[1::9, 3] = 0.0
    return replace(dets, boxes=boxes)


def _all_tied(gt: GroundTruth, seed: int) -> Detections:
    dets = generated_detections(gt, seed)
    return replace(dets, scores=np.full(len(dets), 0.5))


def _crowded_image(gt: GroundTruth, seed: int) -> Detections:
    """More than 100 detections on one image, so max-detections truncation is exercised."""
    rng = np.random.default_rng(seed)
    image = int(gt.ann_image_ids[0])
    mine = gt.ann_image_ids == image
    boxes = np.repeat(gt.ann_boxes[mine], 40, axis=0) + rng.normal(0, 3, (40 * mine.sum(), 4))
    boxes[:, 2:] = np.abs(boxes[:, 2:])
    extra = Detections(
        image_ids=np.full(len(boxes), image),
        category_ids=np.repeat(gt.ann_category_ids[mine], 40),
        boxes=boxes,
        scores=np.round(rng.random(len(boxes)), 1),
    )
    return _concat(generated_detections(gt, seed), extra)


def _concat(a: Detections, b: Detections) -> Detections:
    return Detections(
        np.r_[a.image_ids, b.image_ids],
        np.r_[a.category_ids, b.category_ids],
        np.r_[a.boxes, b.boxes],
        np.r_[a.scores, b.scores],
    )


PARITY_CASES: dict[str, Callable[[], tuple[GroundTruth, Detections]]] = {
    "generated-seed0": lambda: (g := coco128_ground_truth(), generated_detections(g, 0)),
    "generated-seed1": lambda: (g := coco128_ground_truth(), generated_detections(g, 1)),
    "generated-seed2": lambda: (g := coco128_ground_truth(), generated_detections(g, 2)),
    "no-detections": lambda: (coco128_ground_truth(), Detections.empty()),
    "images-without-ground-truth": lambda: (
        g := with_empty_images(coco128_ground_truth()),
        _on_empty_images(g, 3),
    ),
    "zero-size-ground-truth": lambda: (
        g := with_zero_size_boxes(coco128_ground_truth()),
        generated_detections(g, 4),
    ),
    "zero-size-detections": lambda: (g := coco128_ground_truth(), _zero_size_detections(g, 5)),
    "all-scores-tied": lambda: (g := coco128_ground_truth(), _all_tied(g, 6)),
    "over-100-detections-per-image": lambda: (g := coco128_ground_truth(), _crowded_image(g, 7)),
}
"""Named cases: each returns ``(ground_truth, detections)``. COCO128's ground truth has 9
categories without a box, so every generated case also scores detections of those."""
