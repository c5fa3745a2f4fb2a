"""Read COCO ground-truth files and COCO results files into the evaluation contract.

Every problem is an :class:`EvalInputError` that names the file and what is wrong with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from falconet.evaluation.contract import Detections, EvalInputError, GroundTruth


def _read_json(path: Path, what: str) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise EvalInputError(f"{what} {path}: cannot read it ({exc.strerror})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise EvalInputError(
            f"{what} {path} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from exc


def _fields(records: list[Any], keys: tuple[str, ...], where: str) -> None:
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise EvalInputError(f"{where}[{index}] must be an object, got {type(record).__name__}")
        missing = [k for k in keys if k not in record]
        if missing:
            raise EvalInputError(f"{where}[{index}] lacks {', '.join(missing)}")
        box = record.get("bbox")
        if box is not None and (not isinstance(box, list) or len(box) != 4):
            raise EvalInputError(f"{where}[{index}].bbox must be [x, y, w, h], got {box!r}")


def load_ground_truth(path: str | Path) -> GroundTruth:
    """A COCO instances file (``images``, ``annotations``, ``categories``)."""
    data = _read_json(Path(path), "ground-truth file")
    where = f"ground-truth file {path}"
    if not isinstance(data, dict) or not {"images", "annotations", "categories"} <= data.keys():
        raise EvalInputError(
            f"{where} must be a COCO instances object with 'images', 'annotations' and 'categories'"
        )
    images, anns, cats = data["images"], data["annotations"], data["categories"]
    _fields(images, ("id", "height", "width"), f"{where}: images")
    _fields(cats, ("id", "name"), f"{where}: categories")
    _fields(anns, ("image_id", "category_id", "bbox"), f"{where}: annotations")
    boxes = np.array([a["bbox"] for a in anns], dtype=np.float64).reshape(-1, 4)
    try:
        return GroundTruth(
            image_ids=[i["id"] for i in images],
            image_sizes=[(i["height"], i["width"]) for i in images],
            category_ids=[c["id"] for c in cats],
            category_names=[c["name"] for c in cats],
            ann_image_ids=[a["image_id"] for a in anns],
            ann_category_ids=[a["category_id"] for a in anns],
            ann_boxes=boxes,
            ann_areas=[
                a.get("area", b[2] * b[3]) for a, b in zip(anns, boxes.tolist(), strict=True)
            ],
            ann_iscrowd=[bool(a.get("iscrowd", 0)) for a in anns],
        )
    except (TypeError, ValueError) as exc:
        raise EvalInputError(f"{where}: {exc}") from exc


def load_results(path: str | Path) -> Detections:
    """A COCO results file: a list of ``{image_id, category_id, bbox, score}``."""
    data = _read_json(Path(path), "results file")
    where = f"results file {path}"
    if not isinstance(data, list):
        raise EvalInputError(
            f"{where} must be a JSON list of detections "
            f"({{image_id, category_id, bbox, score}}), got a "
            f"{type(data).__name__}"
        )
    _fields(data, ("image_id", "category_id", "bbox", "score"), where)
    try:
        return Detections(
            image_ids=[d["image_id"] for d in data],
            category_ids=[d["category_id"] for d in data],
            boxes=np.array([d["bbox"] for d in data], dtype=np.float64).reshape(-1, 4),
            scores=[d["score"] for d in data],
        )
    except (TypeError, ValueError) as exc:
        raise EvalInputError(f"{where}: {exc}") from exc


def save_results(detections: Detections, path: str | Path) -> Path:
    """Write ``detections`` as a standard COCO results file (the inverse of
    :func:`load_results`)."""
    rows = [
        {"image_id": i, "category_id": c, "bbox": box, "score": score}
        for i, c, box, score in zip(
            detections.image_ids.tolist(),
            detections.category_ids.tolist(),
            detections.boxes.tolist(),
            detections.scores.tolist(),
            strict=True,
        )
    ]
    path = Path(path)
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path
