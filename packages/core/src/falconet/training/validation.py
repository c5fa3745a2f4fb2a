"""Validation: run a model over a split, undo the letterbox, evaluate through the eval registry.

Detections stay on the device until the accumulator's one packed copy, so a validation pass
waits on the host once, not once per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import torch

from falconet.contract import ModelFamily
from falconet.data.records import Dataset, Split
from falconet.evaluation.accumulator import DetectionAccumulator
from falconet.evaluation.contract import EvalResult, GroundTruth
from falconet.evaluation.evaluate import evaluate
from falconet.plugins import Plugins
from falconet.training.distributed import gather_states


def category_ids(dataset: Dataset) -> list[int]:
    """The category id of each contiguous class: COCO's own ids, else ``0..K-1``."""
    return dataset.category_ids or list(range(len(dataset.names)))


def ground_truth(dataset: Dataset, split: Split) -> GroundTruth:
    """The split's boxes (and crowd regions) as a COCO ground truth in original pixels.

    Areas are box areas (``w * h``): a YOLO label has no segmentation area, and using the same
    rule for COCO files keeps the two sources' numbers comparable.
    """
    ids = category_ids(dataset)
    rows: dict[str, list[np.ndarray]] = {k: [] for k in ("image", "cat", "box", "crowd")}
    for sample in split.samples:
        scale = np.array([sample.width, sample.height] * 2, np.float64)
        for boxes, labels, crowd in (
            (sample.boxes, sample.labels, False),
            (sample.crowd, np.zeros(len(sample.crowd), np.int64), True),
        ):
            if not len(boxes):
                continue
            xywh = boxes.astype(np.float64) * scale
            xywh[:, 2:] -= xywh[:, :2]
            rows["box"].append(xywh)
            rows["cat"].append(np.asarray(ids, np.int64)[labels])
            rows["image"].append(np.full(len(boxes), sample.image_id, np.int64))
            rows["crowd"].append(np.full(len(boxes), crowd))
    boxes = np.concatenate(rows["box"]) if rows["box"] else np.zeros((0, 4))
    return GroundTruth(
        image_ids=[s.image_id for s in split.samples],
        image_sizes=[(s.height, s.width) for s in split.samples],
        category_ids=ids,
        category_names=dataset.names,
        ann_image_ids=np.concatenate(rows["image"]) if rows["image"] else [],
        ann_category_ids=np.concatenate(rows["cat"]) if rows["cat"] else [],
        ann_boxes=boxes,
        ann_areas=boxes[:, 2] * boxes[:, 3],
        ann_iscrowd=np.concatenate(rows["crowd"]) if rows["crowd"] else [],
    )


def to_original_pixels(
    detections: list[dict[str, torch.Tensor]], batch: dict[str, torch.Tensor]
) -> list[dict[str, torch.Tensor]]:
    """Undo :func:`~falconet.data.transforms.letterbox`: subtract the padding, divide by the
    resize ratio, clip to the original image (all on the detections' device)."""
    out = []
    for j, det in enumerate(detections):
        boxes = det["boxes"]
        pad = batch["pads"][j].to(boxes.device, boxes.dtype).repeat(2)
        height, width = batch["orig_sizes"][j].tolist()
        boxes = (boxes - pad) / float(batch["ratios"][j])
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
        out.append({**det, "boxes": boxes})
    return out


@torch.no_grad()
def predict_split(
    network: Callable[[torch.Tensor], Any],
    family: ModelFamily,
    loader: Iterable[dict[str, Any]],
    device: torch.device,
    categories: Sequence[int],
    *,
    autocast: AbstractContextManager[Any] | None = None,
    conf: float = 0.001,
    iou: float = 0.7,
    max_det: int = 300,
) -> DetectionAccumulator:
    """Detections for every image of ``loader`` (a val loader, or an iterator over one that
    its workers have already started on), in original pixels, accumulated."""
    accumulator = DetectionAccumulator(categories)
    for batch in loader:
        # uint8 to float32 in [0, 1] in one kernel (.float().div_() is two passes)
        images = batch["images"].to(device, non_blocking=True).div(255)
        with autocast or nullcontext():
            outputs = network(images)
        sizes = [tuple(images.shape[2:])] * len(images)
        detections = family.postprocess(
            outputs, sizes, conf=conf, iou=iou, max_det=max_det, multi_label=True
        )
        accumulator.add(batch["image_ids"].tolist(), to_original_pixels(detections, batch))
    return accumulator


def evaluate_split(
    accumulator: DetectionAccumulator,
    truth: GroundTruth,
    *,
    backend: str,
    plugins: Plugins,
) -> EvalResult | None:
    """COCO bbox evaluation of the accumulated detections (``backend="auto"``: the fastest).

    In a distributed run each rank holds the detections of its share of the split: they are
    gathered on rank 0, each image once (a share padded to equal length repeats images), and
    scored there once; the other ranks get ``None``."""
    states = gather_states(accumulator.state())
    if states is None:
        return None
    return evaluate(
        truth,
        DetectionAccumulator.merge(states, accumulator.category_ids),
        backend=None if backend == "auto" else backend,
        plugins=plugins,
    )


def score_split(
    network: Callable[[torch.Tensor], Any],
    family: ModelFamily,
    loader: Iterable[dict[str, Any]],
    dataset: Dataset,
    device: torch.device,
    cfg: Any,
    plugins: Plugins,
    *,
    autocast: AbstractContextManager[Any] | None = None,
) -> EvalResult | None:
    """``dataset``'s val split predicted by ``network`` (:func:`predict_split`, with ``cfg``'s
    ``conf``, ``iou`` and ``max_det``) and scored by ``cfg.eval_backend``
    (:func:`evaluate_split`): what a run's validation and ``Detector.val`` both do."""
    accumulator = predict_split(
        network,
        family,
        loader,
        device,
        category_ids(dataset),
        autocast=autocast,
        conf=cfg.conf,
        iou=cfg.iou,
        max_det=cfg.max_det,
    )
    truth = ground_truth(dataset, dataset.splits["val"])
    return evaluate_split(accumulator, truth, backend=cfg.eval_backend, plugins=plugins)


METRIC_STATS = {
    "map50-95": "AP",
    "map50": "AP50",
    "map75": "AP75",
    "mar1": "AR1",
    "mar10": "AR10",
    "mar100": "AR100",
    "mars": "ARs",
    "marm": "ARm",
    "marl": "ARl",
}
"""``metric=`` names and the COCO stat each follows (``fitness`` mixes two)."""


def fitness(result: EvalResult, metric: str) -> float:
    """The number ``best.pt`` and early stopping follow (higher is better; an undefined stat,
    ``-1`` as pycocotools gives it where no ground truth falls in its range, counts as 0)."""
    if metric == "fitness":
        ap, ap50 = max(result.stats["AP"], 0.0), max(result.stats["AP50"], 0.0)
        return 0.1 * ap50 + 0.9 * ap
    return max(result.stats[METRIC_STATS[metric]], 0.0)
