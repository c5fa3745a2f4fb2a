"""Hand-built evaluation cases with answers worked out by hand from the COCO protocol.

No backend computed these numbers: each case's docstring derives them from the protocol's
rules, so every backend, pycocotools included, is checked against something other than itself.
The rules used (pycocotools' ``COCOeval``, bbox):

* per image and category, detections are matched greedily in descending score order, each to
  the best still-unmatched ground-truth box with IoU >= t, at each of the 10 thresholds
  t = 0.50, 0.55, ..., 0.95; a crowd region may take any number of detections and its IoU is
  intersection over the *detection's* area; a detection matched to a crowd region, or to a box
  outside the area range, is ignored, and so is an unmatched detection outside the area range;
* areas: small < 32², medium 32²..96², large > 96² (ground truth by its recorded area,
  detections by ``w * h``); a crowd region is never counted as ground truth to recall;
* precision at the first point of the ranked list whose recall reaches r, made non-increasing
  from the right, for r = 0.00, 0.01, ..., 1.00 (101 points), and 0 past the last recall reached;
  AP is the mean over the 101 points, the 10 thresholds and the categories with ground truth;
* AR is the final recall, averaged over thresholds and categories, with at most 1, 10 or 100
  detections per image and category (ignored detections use up slots too);
* -1 where no category has ground truth in the area range (a stat) or for a category.

Every box below is "large" unless said otherwise, so ``APs``, ``APm``, ``ARs`` and ``ARm`` are
-1 and ``APl`` and ``ARl`` repeat ``AP`` and ``AR100``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from falconet.evaluation.contract import STAT_KEYS, Detections, GroundTruth

UNDEFINED = -1.0


@dataclass(frozen=True)
class KnownAnswer:
    """A case and its hand-derived result: 12 stats, per-class AP and AP50 (keyed by name, in
    ascending category-id order, as :class:`~falconet.evaluation.EvalResult` keys them)."""

    ground_truth: GroundTruth
    detections: Detections
    stats: Mapping[str, float]
    per_class_ap: Mapping[str, float]
    per_class_ap50: Mapping[str, float]


def _ground_truth(
    boxes: list[list[float]],
    *,
    categories: Mapping[int, str] | None = None,
    labels: list[int] | None = None,
    crowd: list[bool] | None = None,
) -> GroundTruth:
    """One 1000x1000 image; areas are ``w * h``; one category ``a`` (id 1) unless given."""
    categories = dict(categories or {1: "a"})
    array = np.array(boxes, dtype=float).reshape(-1, 4)
    return GroundTruth(
        image_ids=[1],
        image_sizes=[[1000, 1000]],
        category_ids=list(categories),
        category_names=list(categories.values()),
        ann_image_ids=[1] * len(array),
        ann_category_ids=labels or [next(iter(categories))] * len(array),
        ann_boxes=array,
        ann_areas=array[:, 2] * array[:, 3],
        ann_iscrowd=crowd or [False] * len(array),
    )


def _detections(rows: list[tuple[list[float], float]], labels: list[int] | None = None):
    return Detections(
        image_ids=[1] * len(rows),
        category_ids=labels or [1] * len(rows),
        boxes=np.array([box for box, _ in rows], dtype=float),
        scores=[score for _, score in rows],
    )


def _stats(
    ap: float,
    ap50: float,
    ap75: float,
    ar1: float,
    ar10: float,
    ar100: float,
    *,
    small: tuple[float, float] = (UNDEFINED, UNDEFINED),
    medium: tuple[float, float] = (UNDEFINED, UNDEFINED),
    large: tuple[float, float] | None = None,
) -> dict[str, float]:
    """The 12 stats; ``small``, ``medium``, ``large`` are (AP, AR100) of that area range."""
    aps, ars = small
    apm, arm = medium
    apl, arl = (ap, ar100) if large is None else large
    values = (ap, ap50, ap75, aps, apm, apl, ar1, ar10, ar100, ars, arm, arl)
    return dict(zip(STAT_KEYS, (float(v) for v in values), strict=True))


def perfect_detection() -> KnownAnswer:
    """One box, one detection on it: precision 1 at every recall, recall 1 everywhere."""
    box = [10.0, 10.0, 200.0, 200.0]
    return KnownAnswer(
        _ground_truth([box]),
        _detections([(box, 0.9)]),
        _stats(1.0, 1.0, 1.0, 1.0, 1.0, 1.0),
        {"a": 1.0},
        {"a": 1.0},
    )


def false_positive_above_a_true_positive() -> KnownAnswer:
    """A false positive (0.9) ranked above a hit at IoU 0.64 (0.8) on a 200x200 box.

    IoU = 200*128 / 200*200 = 0.64: a hit at t = 0.50, 0.55, 0.60, a miss at the 7 others.
    At a hit threshold the ranked list is (FP, TP): recall (0, 1), precision (0, 1/2), made
    non-increasing (1/2, 1/2): 1/2 at all 101 points. At a miss threshold recall never leaves 0:
    precision 0 at every point. AP = 3 * 1/2 / 10 = 0.15, AP50 = 1/2, AP75 = 0.
    AR100 = AR10 = 3/10; AR1 = 0 (the one detection kept is the false positive).
    """
    return KnownAnswer(
        _ground_truth([[0.0, 0.0, 200.0, 200.0]]),
        _detections([([400.0, 400.0, 200.0, 200.0], 0.9), ([0.0, 0.0, 200.0, 128.0], 0.8)]),
        _stats(0.15, 0.5, 0.0, 0.0, 0.3, 0.3),
        {"a": 0.15},
        {"a": 0.5},
    )


def interpolation_over_101_points() -> KnownAnswer:
    """Three boxes; hit (0.9), false positive (0.8), hit (0.7); the third box missed.

    Recall (1/3, 1/3, 2/3), precision (1, 1/2, 2/3), made non-increasing (1, 2/3, 2/3).
    Recall points 0.00..0.33 (34 of them) reach the first row: 1; 0.34..0.66 (33) the third:
    2/3; 0.67..1.00 (34) are never reached: 0. AP = (34 + 33 * 2/3) / 101 = 56/101 at every
    threshold (the hits are exact), where the area under the curve would be 5/9.
    AR100 = AR10 = 2/3; AR1 = 1/3 (the top detection is a hit).
    """
    boxes = [[0.0, 0.0, 100.0, 100.0], [200.0, 0.0, 100.0, 100.0], [400.0, 0.0, 100.0, 100.0]]
    ap = 56 / 101
    return KnownAnswer(
        _ground_truth(boxes),
        _detections([(boxes[0], 0.9), ([0.0, 300.0, 100.0, 100.0], 0.8), (boxes[1], 0.7)]),
        _stats(ap, ap, ap, 1 / 3, 2 / 3, 2 / 3),
        {"a": ap},
        {"a": ap},
    )


def duplicate_matched_greedily_by_score() -> KnownAnswer:
    """A loose detection (IoU 0.72, score 0.95) above an exact one (0.9) of the same box.

    At t <= 0.70 (5 thresholds) the loose one, first by score, takes the box and the exact one
    is a duplicate, a false positive after it: precision 1 at every recall point, AP_t = 1. At
    t >= 0.75 (5) the loose one misses and the exact one hits after it: AP_t = 1/2.
    AP = (5 + 5/2) / 10 = 0.75, AP50 = 1, AP75 = 1/2; AR100 = AR10 = 1; AR1 = 5/10 (the one
    detection kept is the loose one).
    """
    box = [0.0, 0.0, 200.0, 200.0]
    return KnownAnswer(
        _ground_truth([box]),
        _detections([([0.0, 0.0, 200.0, 144.0], 0.95), (box, 0.9)]),
        _stats(0.75, 1.0, 0.5, 0.5, 1.0, 1.0),
        {"a": 0.75},
        {"a": 1.0},
    )


def crowd_region_ignores_what_falls_in_it() -> KnownAnswer:
    """A box and a crowd region beside it; two detections inside the crowd region (0.95, 0.93)
    rank above the hit on the box (0.9).

    Each crowd detection lies wholly inside the region (IoU over its own area: 1), so both are
    ignored: neither true nor false positive. The region is not ground truth to recall, so the
    hit alone gives recall 1 at precision 1: AP = 1, AR100 = AR10 = 1. AR1 = 0: the one slot
    per image goes to the top detection, an ignored one.
    """
    return KnownAnswer(
        _ground_truth([[0.0, 0.0, 200.0, 200.0], [300.0, 0.0, 200.0, 200.0]], crowd=[False, True]),
        _detections(
            [
                ([320.0, 20.0, 100.0, 100.0], 0.95),
                ([350.0, 50.0, 120.0, 120.0], 0.93),
                ([0.0, 0.0, 200.0, 200.0], 0.9),
            ]
        ),
        _stats(1.0, 1.0, 1.0, 0.0, 1.0, 1.0),
        {"a": 1.0},
        {"a": 1.0},
    )


def area_ranges() -> KnownAnswer:
    """A small (20x20), a medium (50x50) and a large (150x150) box; detections: a small false
    positive (10x10, 0.95), hits on the small (0.9) and the large (0.8) box; the medium missed.

    all: ranked (FP, TP, TP), recall (0, 1/3, 2/3), precision (0, 1/2, 2/3) -> (2/3, 2/3, 2/3);
    points 0.00..0.66 (67) give 2/3: AP = 67 * 2/3 / 101 = 134/303; AR100 = AR10 = 2/3; AR1 = 0.
    small: the large hit matches a box outside the range: ignored; (FP, TP): APs = 1/2, ARs = 1.
    medium: the false positive is outside the range and unmatched, the hits match boxes outside
    it: all ignored; nothing reaches the medium box: APm = 0, ARm = 0.
    large: only the large hit counts: APl = 1, ARl = 1.
    """
    small, medium, large = [0.0, 0.0, 20.0, 20.0], [100.0, 0.0, 50.0, 50.0], [200.0, 0, 150, 150]
    ap = 134 / 303
    return KnownAnswer(
        _ground_truth([small, medium, large]),
        _detections([([500.0, 500.0, 10.0, 10.0], 0.95), (small, 0.9), (large, 0.8)]),
        _stats(
            ap, ap, ap, 0.0, 2 / 3, 2 / 3, small=(0.5, 1.0), medium=(0.0, 0.0), large=(1.0, 1.0)
        ),
        {"a": ap},
        {"a": ap},
    )


def categories_averaged_one_without_ground_truth() -> KnownAnswer:
    """Categories ``dog`` (id 3), ``cat`` (1), ``bird`` (5), listed out of id order.

    cat: an exact hit: AP 1. dog: a false positive (0.8) above an exact hit (0.7): AP 1/2 (see
    :func:`false_positive_above_a_true_positive`). bird: a detection but no ground truth:
    undefined (-1), left out of the mean. AP = AP50 = AP75 = (1 + 1/2) / 2 = 0.75;
    AR100 = AR10 = 1; AR1 = (1 + 0) / 2 (one detection per image *and category*).
    """
    cat, dog = [0.0, 0.0, 200.0, 200.0], [300.0, 0.0, 200.0, 200.0]
    return KnownAnswer(
        _ground_truth([cat, dog], categories={3: "dog", 1: "cat", 5: "bird"}, labels=[1, 3]),
        _detections(
            [
                (cat, 0.9),
                ([300.0, 300.0, 200.0, 200.0], 0.8),
                (dog, 0.7),
                ([0.0, 400.0, 100.0, 100.0], 0.6),
            ],
            labels=[1, 3, 3, 5],
        ),
        _stats(0.75, 0.75, 0.75, 0.5, 1.0, 1.0),
        {"cat": 1.0, "dog": 0.5, "bird": UNDEFINED},
        {"cat": 1.0, "dog": 0.5, "bird": UNDEFINED},
    )


KNOWN_ANSWERS: dict[str, Callable[[], KnownAnswer]] = {
    "perfect-detection": perfect_detection,
    "false-positive-above-a-hit-at-iou-0.64": false_positive_above_a_true_positive,
    "interpolation-over-101-points": interpolation_over_101_points,
    "duplicate-matched-greedily-by-score": duplicate_matched_greedily_by_score,
    "crowd-region-ignores-what-falls-in-it": crowd_region_ignores_what_falls_in_it,
    "area-ranges": area_ranges,
    "categories-averaged-one-without-ground-truth": categories_averaged_one_without_ground_truth,
}
"""Named cases: each returns a :class:`KnownAnswer`; its docstring derives the numbers."""
