"""Labels from a COCO instances file, for a yaml that names one.

    path: .
    train: images/train2017               # the folder the file_names are relative to
    val: images/val2017
    coco_json: annotations/instances.json # one file for every split, or per split:
    train_json: annotations/instances_train2017.json
    val_json: annotations/instances_val2017.json

Categories become contiguous classes in ascending id order; the ids are kept
(``Dataset.category_ids``) so evaluation reports COCO's own ids. ``iscrowd`` boxes become
ignore regions (``Sample.crowd``), never training targets. ``names`` may be left out (the
file's category names are used); when given it must list the same names in that order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from falconet.data.check import Candidate, Targets
from falconet.data.images import ImageInfo
from falconet.data.records import DataError, Problem, as_boxes, clip_boxes


def read_coco(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DataError(f"COCO file {path}: cannot read it ({exc.strerror})") from exc
    except ValueError as exc:
        raise DataError(f"COCO file {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not {"images", "annotations", "categories"} <= data.keys():
        raise DataError(f"COCO file {path} must hold images, annotations and categories")
    return data


def coco_categories(data: dict[str, Any]) -> tuple[list[int], list[str]]:
    cats = sorted(data["categories"], key=lambda c: c["id"])
    return [int(c["id"]) for c in cats], [str(c["name"]) for c in cats]


def coco_candidates(
    data: dict[str, Any], json_path: Path, image_dir: Path, category_ids: list[int]
) -> tuple[list[Candidate], list[Problem]]:
    """Candidates for every image of the file, and the problems found in the file itself."""
    where = str(json_path)
    problems: list[Problem] = []
    index = {cid: i for i, cid in enumerate(category_ids)}
    images: dict[int, dict[str, Any]] = {}
    for image in data["images"]:
        if image["id"] in images:
            problems.append(
                Problem(
                    "coco-duplicate-id",
                    where,
                    f"image id {image['id']} appears again ({image.get('file_name')})",
                    "skipped",
                )
            )
            continue
        images[image["id"]] = image
    per_image: dict[int, list[dict[str, Any]]] = {i: [] for i in images}
    seen_ann: set[Any] = set()
    for ann in data["annotations"]:
        ann_id = ann.get("id")
        if ann_id is not None and ann_id in seen_ann:
            problems.append(
                Problem(
                    "coco-duplicate-id", where, f"annotation id {ann_id} appears again", "dropped"
                )
            )
            continue
        seen_ann.add(ann_id)
        if ann.get("image_id") not in images:
            problems.append(
                Problem(
                    "coco-unknown-image",
                    where,
                    f"annotation {ann_id} refers to image id {ann.get('image_id')}, not in images",
                    "dropped",
                )
            )
        elif ann.get("category_id") not in index:
            problems.append(
                Problem(
                    "coco-unknown-category",
                    where,
                    f"annotation {ann_id} "
                    f"refers to category id {ann.get('category_id')}, not in "
                    "categories",
                    "dropped",
                )
            )
        else:
            per_image[ann["image_id"]].append(ann)
    candidates = []
    for image_id, image in images.items():
        path = image_dir / image["file_name"]
        candidates.append(
            Candidate(
                path, int(image_id), targets=_targets(image, per_image[image_id], index, where)
            )
        )
    return candidates, problems


def _targets(
    image: dict[str, Any], anns: list[dict[str, Any]], index: dict[int, int], where: str
) -> Callable[[ImageInfo], Targets]:
    def targets(info: ImageInfo) -> Targets:
        problems: list[Problem] = []
        width, height = image.get("width") or info.width, image.get("height") or info.height
        if (width, height) != (info.width, info.height):
            problems.append(
                Problem(
                    "coco-size-mismatch",
                    where,
                    f"image {image['id']} is "
                    f"{info.width}x{info.height} but the file says "
                    f"{width}x{height}; boxes are read in the file's frame",
                    "noted",
                )
            )
        rows, labels, crowd = [], [], []
        for ann in anns:
            box = ann.get("bbox")
            if not (
                isinstance(box, list)
                and len(box) == 4
                and all(isinstance(v, int | float) and math.isfinite(v) for v in box)
            ):
                problems.append(
                    Problem(
                        "label-parse",
                        where,
                        f"annotation {ann.get('id')}: bbox {box!r} is not four finite numbers",
                        "dropped",
                    )
                )
                continue
            x, y, w, h = box
            if w <= 0 or h <= 0:
                problems.append(
                    Problem(
                        "label-size",
                        where,
                        f"annotation {ann.get('id')}: non-positive size w={w}, h={h}",
                        "dropped",
                    )
                )
                continue
            xyxy = np.array([[x / width, y / height, (x + w) / width, (y + h) / height]])
            clipped, changed, empty = clip_boxes(xyxy)
            if empty[0]:
                problems.append(
                    Problem(
                        "label-outside",
                        where,
                        f"annotation {ann.get('id')}: box lies outside the image",
                        "dropped",
                    )
                )
                continue
            if changed[0]:
                problems.append(
                    Problem(
                        "label-outside",
                        where,
                        f"annotation {ann.get('id')}: box extends past the image edge",
                        "clipped",
                    )
                )
            if ann.get("iscrowd"):
                crowd.append(clipped[0].tolist())
            else:
                rows.append(clipped[0].tolist())
                labels.append(index[ann["category_id"]])
        return as_boxes(rows), np.asarray(labels, np.int64), as_boxes(crowd), problems

    return targets
