"""Parse a YOLO label file line by line, keeping what is usable and reporting the rest.

Each line is ``class cx cy w h`` normalised to ``[0, 1]``. A bad line never spoils the rest of
the file: it is dropped with a problem naming the file and line.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from falconet.data.records import Problem, as_boxes, clip_boxes


def parse_yolo_labels(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray, list[Problem]]:
    """``(boxes [n, 4] xyxy normalised, labels [n], problems)`` of one label file."""
    where = str(path)
    problems: list[Problem] = []
    rows: list[list[float]] = []
    labels: list[int] = []
    seen: set[tuple[int, tuple[float, ...]]] = set()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        boxes, labels = _empty()
        return boxes, labels, [Problem("label-unreadable", where, f"cannot read: {exc}", "skipped")]
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 5:
            problems.append(
                Problem(
                    "label-columns",
                    where,
                    f"{len(fields)} columns, expected 5 (class cx cy w h)",
                    "dropped",
                    number,
                )
            )
            continue
        try:
            values = [float(f) for f in fields]
        except ValueError:
            problems.append(
                Problem("label-parse", where, f"not numbers: {line.strip()!r}", "dropped", number)
            )
            continue
        if not all(math.isfinite(v) for v in values):
            problems.append(
                Problem(
                    "label-non-finite", where, f"NaN or inf: {line.strip()!r}", "dropped", number
                )
            )
            continue
        cls, cx, cy, w, h = values
        if cls != int(cls) or not 0 <= cls < num_classes:
            problems.append(
                Problem(
                    "label-class",
                    where,
                    f"class {fields[0]} is not in 0..{num_classes - 1} (names has {num_classes})",
                    "dropped",
                    number,
                )
            )
            continue
        if w <= 0 or h <= 0:
            problems.append(
                Problem("label-size", where, f"non-positive size w={w}, h={h}", "dropped", number)
            )
            continue
        key = (int(cls), (cx, cy, w, h))
        if key in seen:
            problems.append(
                Problem(
                    "label-duplicate",
                    where,
                    "same class and box as an earlier line",
                    "dropped",
                    number,
                )
            )
            continue
        seen.add(key)
        box = np.array([[cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]])
        clipped, changed, empty = clip_boxes(box)
        if empty[0]:
            problems.append(
                Problem("label-outside", where, "box lies outside the image", "dropped", number)
            )
            continue
        if changed[0]:
            problems.append(
                Problem(
                    "label-outside", where, "box extends past the image edge", "clipped", number
                )
            )
        rows.append(clipped[0].tolist())
        labels.append(int(cls))
    return as_boxes(rows), np.asarray(labels, dtype=np.int64), problems


def _empty() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((0, 4), np.float32), np.zeros(0, np.int64)
