"""COCO bbox evaluation by hotcoco, fed falconet's arrays directly.

Ground truth goes in through ``COCO.from_arrays`` (annotation columns, one small dict per image
and category) and detections as one ``[N, 7]`` float64 array through ``load_res``: no list of
dicts per box, no JSON. hotcoco matches pycocotools bit for bit (the parity suite checks it).

Threads: hotcoco runs on rayon's global pool, which reads ``RAYON_NUM_THREADS`` once, at its
first parallel call in the process. ``threads`` therefore takes effect only on the first
evaluation of a process; a later, different value is reported in the log and not applied.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from falconet.evaluation.contract import (
    Detections,
    EvalResult,
    GroundTruth,
    require_library,
    result_from_cocoeval,
)

log = logging.getLogger(__name__)

_threads_fixed: str | None = None
"""The thread count rayon took at the first evaluation of this process (process-wide)."""


class HotcocoBackend:
    """COCO bbox evaluation by hotcoco (Rust, multi-threaded)."""

    name = "hotcoco"
    summary = "COCO evaluation in Rust (hotcoco), fed arrays; pycocotools' numbers"
    priority = 20  # eval_backend=auto: the fastest of the bundled backends (docs/evaluation.md)

    def _library(self) -> Any:
        return require_library(
            "hotcoco", self.name, "hotcoco (or: pip install falconet-eval-hotcoco)"
        )

    def version(self) -> str:
        return str(self._library().__version__)

    @staticmethod
    def _set_threads(threads: int | None) -> None:
        global _threads_fixed
        if _threads_fixed is None:
            if threads is not None:
                os.environ["RAYON_NUM_THREADS"] = str(threads)
            _threads_fixed = os.environ.get("RAYON_NUM_THREADS", "all cores")
        elif threads is not None and str(threads) != _threads_fixed:
            log.warning(
                "hotcoco: threads=%s ignored: rayon fixed the thread count at the first "
                "evaluation of this process (%s)",
                threads,
                _threads_fixed,
            )

    def evaluate(
        self, ground_truth: GroundTruth, detections: Detections, *, threads: int | None = None
    ) -> EvalResult:
        hotcoco = self._library()
        self._set_threads(threads)
        gt = ground_truth
        coco_gt = hotcoco.COCO.from_arrays(
            [
                {"id": i, "height": h, "width": w}
                for i, (h, w) in zip(gt.image_ids.tolist(), gt.image_sizes.tolist(), strict=True)
            ],
            [
                {"id": c, "name": n}
                for c, n in zip(gt.category_ids.tolist(), gt.category_names, strict=True)
            ],
            gt.ann_image_ids,
            gt.ann_category_ids,
            gt.ann_boxes,
            area=gt.ann_areas,
            iscrowd=gt.ann_iscrowd.astype(np.int64),
        )
        rows = np.column_stack(
            [detections.image_ids, detections.boxes, detections.scores, detections.category_ids]
        ).astype(np.float64, copy=False)
        evaluator = hotcoco.COCOeval(coco_gt, coco_gt.load_res(rows.reshape(-1, 7)), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summary_lines()  # fills .stats without printing
        return result_from_cocoeval(
            evaluator.stats,
            evaluator.eval["precision"],
            ground_truth.names_by_sorted_id(),
            self.name,
            str(hotcoco.__version__),
        )
