"""The reference backend: pycocotools itself, fed the same arrays every backend gets.

Every other backend must reproduce its numbers exactly; it is itself checked against answers
derived by hand (``falconet_testing.known_answers``). It also
covers what pycocotools crashes on when driven directly: with no detections at all,
``COCO.loadRes`` raises IndexError, so an empty result set is built without it and evaluated
normally (every stat with ground truth is then 0).
"""

from __future__ import annotations

import contextlib
import io
from importlib.metadata import version

from falconet.evaluation.contract import (
    Detections,
    EvalResult,
    GroundTruth,
    result_from_cocoeval,
)


class PycocotoolsBackend:
    """COCO bbox evaluation by pycocotools (single-threaded; ``threads`` is ignored)."""

    name = "pycocotools"
    summary = "the reference COCO evaluator (pycocotools), single-threaded"
    priority = 0  # eval_backend=auto: the reference: the slowest, always there

    def version(self) -> str:
        return version("pycocotools")

    def evaluate(
        self, ground_truth: GroundTruth, detections: Detections, *, threads: int | None = None
    ) -> EvalResult:
        from pycocotools.cocoeval import COCOeval

        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
            coco_gt = coco_from_ground_truth(ground_truth)
            coco_dt = _load_results(coco_gt, detections)
            evaluator = COCOeval(coco_gt, coco_dt, "bbox")
            evaluator.evaluate()
            evaluator.accumulate()
            evaluator.summarize()
        return result_from_cocoeval(
            evaluator.stats,
            evaluator.eval["precision"],
            ground_truth.names_by_sorted_id(),
            self.name,
            self.version(),
        )


def coco_from_ground_truth(ground_truth: GroundTruth):  # -> pycocotools.coco.COCO
    """A pycocotools ``COCO`` index built from the arrays (annotation ids 1..N: 0 would read
    as "unmatched" inside COCOeval)."""
    from pycocotools.coco import COCO

    gt = ground_truth
    coco = COCO()
    coco.dataset = {
        "images": [
            {"id": int(i), "height": int(h), "width": int(w)}
            for i, (h, w) in zip(gt.image_ids.tolist(), gt.image_sizes.tolist(), strict=True)
        ],
        "categories": [
            {"id": int(c), "name": n}
            for c, n in zip(gt.category_ids.tolist(), gt.category_names, strict=True)
        ],
        "annotations": [
            {
                "id": j,
                "image_id": i,
                "category_id": c,
                "bbox": box,
                "area": area,
                "iscrowd": int(crowd),
            }
            for j, (i, c, box, area, crowd) in enumerate(
                zip(
                    gt.ann_image_ids.tolist(),
                    gt.ann_category_ids.tolist(),
                    gt.ann_boxes.tolist(),
                    gt.ann_areas.tolist(),
                    gt.ann_iscrowd.tolist(),
                    strict=True,
                ),
                start=1,
            )
        ],
    }
    coco.createIndex()
    return coco


def _load_results(coco_gt, detections: Detections):
    from pycocotools.coco import COCO

    if len(detections) == 0:
        empty = COCO()
        empty.dataset = {
            "images": list(coco_gt.dataset["images"]),
            "categories": list(coco_gt.dataset["categories"]),
            "annotations": [],
        }
        empty.createIndex()
        return empty
    return coco_gt.loadRes(
        [
            {"image_id": i, "category_id": c, "bbox": box, "score": s}
            for i, c, box, s in zip(
                detections.image_ids.tolist(),
                detections.category_ids.tolist(),
                detections.boxes.tolist(),
                detections.scores.tolist(),
                strict=True,
            )
        ]
    )
