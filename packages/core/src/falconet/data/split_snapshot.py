"""A checked split as it came out, for the next run to take whole while no file changed.

:mod:`falconet.data.check` keeps a result per file, so that one changed file is checked again
alone. Taking those results back costs a look-up, a few objects and a JSON value per file:
about 3 s a 20k-image split on a 2-core machine, so ~20 s for COCO's 118k before the first
batch (docs/lab/2026-12-07-data-at-scale.md). The snapshot is the split itself in a few flat
arrays (one ``.npz`` file): the samples' sizes, boxes and labels end to end with their
offsets, the problems as one JSON text. It is keyed by every file's path, size and
modification time, so a run that finds the same key builds the split from the arrays and
reads nothing else; any change makes a new key, and the per-file cache checks what changed.

YOLO splits only: a COCO split's targets come from its annotation file, parsed on every run.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from falconet.data.records import Problem, Sample, Split
from falconet.paths import cache_dir

if TYPE_CHECKING:
    from falconet.data.check import Candidate

SNAPSHOT_VERSION = 1


def _stamp(path: Path | None) -> str:
    if path is None:
        return "-"
    name = os.fspath(path)
    try:
        stat = os.stat(name)
    except OSError:
        return f"{name}|missing"
    return f"{name}|{stat.st_size}|{stat.st_mtime_ns}"


def snapshot_key(candidates: Sequence[Candidate], num_classes: int, cache_key: str) -> str:
    """The digest of every image's and label file's path, size and modification time."""
    digest = hashlib.sha1(f"{SNAPSHOT_VERSION}|{cache_key}|{num_classes}".encode())
    stamps = [f"{_stamp(c.image)}>{_stamp(c.label_file)}" for c in candidates]
    digest.update("\n".join(stamps).encode())
    return digest.hexdigest()


def _path(key: str) -> Path:
    return cache_dir("splits") / f"{key[:24]}.npz"


def load_snapshot(key: str, name: str, candidates: Sequence[Candidate]) -> Split | None:
    """The split saved under ``key``, or ``None`` (none saved, or unreadable)."""
    try:
        with np.load(_path(key), allow_pickle=False) as held:
            arrays = {k: held[k] for k in held.files}
        if str(arrays["key"]) != key or len(candidates) != int(arrays["total"]):
            return None
        rows = json.loads(str(arrays["problems"]))
    except (OSError, ValueError, KeyError):
        return None
    box_at, crowd_at = arrays["box_offsets"].tolist(), arrays["crowd_offsets"].tolist()
    boxes, labels, crowd = arrays["boxes"], arrays["labels"], arrays["crowd"]
    for shared in (boxes, labels, crowd):  # the samples' arrays are views of these
        shared.setflags(write=False)
    samples = [
        Sample(
            candidates[c].image,
            candidates[c].image_id,
            width,
            height,
            boxes[box_at[i] : box_at[i + 1]],
            labels[box_at[i] : box_at[i + 1]],
            crowd[crowd_at[i] : crowd_at[i + 1]],
            exif_oriented=oriented,
        )
        for i, (c, width, height, oriented) in enumerate(
            zip(
                arrays["candidate"].tolist(),
                arrays["width"].tolist(),
                arrays["height"].tolist(),
                arrays["oriented"].tolist(),
                strict=True,
            )
        )
    ]
    return Split(name, samples, [Problem(*row) for row in rows], len(candidates))


def save_snapshot(key: str, split: Split, candidates: Sequence[Candidate]) -> None:
    """Write ``split`` under ``key``, atomically (a run killed half-way leaves the old one)."""
    position = {c.image: i for i, c in enumerate(candidates)}
    samples = split.samples

    def offsets(counts: list[int]) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)

    def joined(parts: list[np.ndarray], dtype, shape) -> np.ndarray:
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(shape, dtype)

    rows = [[p.code, p.path, p.message, p.action, p.line] for p in split.problems]
    arrays = {
        "key": np.array(key),
        "total": np.array(split.images_total),
        "candidate": np.array([position[s.image] for s in samples], np.int64),
        "width": np.array([s.width for s in samples], np.int64),
        "height": np.array([s.height for s in samples], np.int64),
        "oriented": np.array([s.exif_oriented for s in samples], bool),
        "box_offsets": offsets([len(s.labels) for s in samples]),
        "boxes": joined([s.boxes.reshape(-1, 4) for s in samples], np.float32, (0, 4)),
        "labels": joined([s.labels for s in samples], np.int64, (0,)),
        "crowd_offsets": offsets([len(s.crowd) for s in samples]),
        "crowd": joined([s.crowd.reshape(-1, 4) for s in samples], np.float32, (0, 4)),
        "problems": np.array(json.dumps(rows)),
    }
    path = _path(key)
    tmp = path.with_suffix(f".tmp{os.getpid()}.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
