"""COCO bbox evaluation by vernier, fed falconet's arrays directly, in strict parity mode.

Ground truth goes in through ``CocoDataset.from_arrays`` (columns, int64/float64, the file's
recorded areas) and detections as one ``[N, 7]`` float64 array. vernier's ``Evaluator`` defaults
to ``parity_mode="corrected"``; this backend asks for ``"strict"``, pycocotools' behaviour.
``evaluate_bbox_grid`` (exported by ``vernier.instance``) is used rather than ``Evaluator``
because it returns the precision array, from which per-class AP and AP50 are read the same way
as for every backend; ``Evaluator``'s per-class table would need polars.

Threads: ``threads=None`` uses every core (vernier's own default is one thread).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from falconet.evaluation.contract import (
    Detections,
    EvalResult,
    GroundTruth,
    require_library,
    result_from_cocoeval,
)

MAX_DETS = [1, 10, 100]


class VernierBackend:
    """COCO bbox evaluation by vernier (Rust, multi-threaded), pycocotools-strict."""

    name = "vernier"
    summary = "COCO evaluation in Rust (vernier, strict parity mode), fed arrays"
    priority = 10  # eval_backend=auto: between hotcoco and pycocotools (docs/evaluation.md)

    def _library(self) -> Any:
        return require_library(
            "vernier.instance", self.name, "vernier (or: pip install falconet-eval-vernier)"
        )

    def version(self) -> str:
        self._library()
        import vernier

        return str(vernier.__version__)

    def evaluate(
        self, ground_truth: GroundTruth, detections: Detections, *, threads: int | None = None
    ) -> EvalResult:
        instance = self._library()
        gt = ground_truth
        dataset = instance.CocoDataset.from_arrays(
            {
                "id": gt.image_ids,
                "width": np.ascontiguousarray(gt.image_sizes[:, 1]),
                "height": np.ascontiguousarray(gt.image_sizes[:, 0]),
            },
            {
                "id": np.arange(1, len(gt.ann_image_ids) + 1, dtype=np.int64),
                "image_id": gt.ann_image_ids,
                "category_id": gt.ann_category_ids,
                "bbox": gt.ann_boxes,
                "area": gt.ann_areas,
                "iscrowd": gt.ann_iscrowd.astype(np.int64),
            },
            [
                {"id": c, "name": n}
                for c, n in zip(gt.category_ids.tolist(), gt.category_names, strict=True)
            ],
        )
        rows = np.ascontiguousarray(
            np.column_stack(
                [
                    detections.image_ids,
                    detections.boxes,
                    detections.scores,
                    detections.category_ids,
                ]
            ),
            dtype=np.float64,
        ).reshape(-1, 7)
        grid = instance.evaluate_bbox_grid(
            dataset,
            rows,
            parity_mode="strict",
            max_dets_per_image=MAX_DETS[-1],
            use_cats=True,
            num_threads=0 if threads is None else threads,
        )
        accumulated = grid.accumulate(MAX_DETS)
        stats = accumulated.summarize(MAX_DETS).stats
        return result_from_cocoeval(
            stats,
            accumulated.precision,
            ground_truth.names_by_sorted_id(),
            self.name,
            self.version(),
        )
