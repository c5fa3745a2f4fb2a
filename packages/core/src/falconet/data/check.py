"""Check every image and label of a split once, in parallel, with a cache for the next run.

Image inspection (a full decode) and label parsing are cached per file under the cache folder,
keyed by path, size and modification time, in one JSON file per image folder (so a yaml that
combines folders checked before, or a list file of some of their images, finds them checked):
a second run over unchanged data reads that file instead of decoding every image. The cache
is written atomically and never inside the dataset. A file that changed is checked again;
nothing else is. A YOLO split whose files all stand as they were is taken whole from its
snapshot (:mod:`falconet.data.split_snapshot`), without the per-file results.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from falconet.data.images import ORIENTED, ImageInfo, inspect_image
from falconet.data.labels import parse_yolo_labels
from falconet.data.records import Problem, Sample, Split
from falconet.data.split_snapshot import load_snapshot, save_snapshot, snapshot_key
from falconet.paths import cache_dir

CACHE_VERSION = 1

Targets = tuple[np.ndarray, np.ndarray, np.ndarray, list[Problem]]
"""``(boxes [n, 4] xyxy normalised, labels [n], crowd [m, 4], problems)``."""


@dataclass(frozen=True)
class Candidate:
    """An image to check and where its targets come from.

    YOLO: ``label_file`` (``None`` when the image has none: a background image). COCO:
    ``targets``, a callable turning the image's :class:`ImageInfo` into targets (the
    annotations were read from the JSON already).
    """

    image: Path
    image_id: int
    label_file: Path | None = None
    targets: Callable[[ImageInfo], Targets] | None = None


def _fingerprint(path: Path) -> str | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return f"{path}|{stat.st_size}|{stat.st_mtime_ns}"


class _Cache:
    """Per-file results of earlier checks of one image folder's files, in one JSON file."""

    def __init__(self, key: str) -> None:
        digest = hashlib.sha1(key.encode()).hexdigest()[:16]
        self.path = cache_dir("checks") / f"{digest}.json"
        self.images: dict[str, Any] = {}
        self.labels: dict[str, Any] = {}
        self.dirty = False
        try:
            stored = json.loads(self.path.read_text())
            if stored.get("version") == CACHE_VERSION:
                self.images, self.labels = stored["images"], stored["labels"]
        except (OSError, ValueError, KeyError):
            pass  # no cache yet, or an unreadable one: check everything again

    def save(self) -> None:
        if not self.dirty:
            return
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(
            json.dumps({"version": CACHE_VERSION, "images": self.images, "labels": self.labels})
        )
        os.replace(tmp, self.path)


def _problem_rows(problems: list[Problem]) -> list[list[Any]]:
    return [[p.code, p.path, p.message, p.action, p.line] for p in problems]


def _problems(rows: list[list[Any]]) -> list[Problem]:
    return [
        Problem(code, path, message, action, line) for code, path, message, action, line in rows
    ]


class _NotCached(Exception):
    """A file the cache has no result for, met where only cached results are taken."""


def _image(
    cache: _Cache, path: Path, cached_only: bool = False
) -> tuple[ImageInfo | None, list[Problem]]:
    key = _fingerprint(path)
    if key is not None and key in cache.images:
        info, rows = cache.images[key]
        return (ImageInfo(*info) if info else None), _problems(rows)
    if cached_only:
        raise _NotCached
    info, problems = inspect_image(path)
    if key is not None:
        cache.images[key] = [
            [info.width, info.height, info.mode] if info else None,
            _problem_rows(problems),
        ]
        cache.dirty = True
    return info, problems


def _yolo_targets(
    cache: _Cache, path: Path | None, num_classes: int, cached_only: bool = False
) -> Targets:
    empty = np.zeros((0, 4), np.float32)
    if path is None:
        return empty, np.zeros(0, np.int64), empty, []
    key = _fingerprint(path)
    if key is not None and f"{key}|{num_classes}" in cache.labels:
        boxes, labels, rows = cache.labels[f"{key}|{num_classes}"]
        return (
            np.asarray(boxes, np.float32).reshape(-1, 4),
            np.asarray(labels, np.int64),
            empty,
            _problems(rows),
        )
    if cached_only:
        raise _NotCached
    boxes, labels, problems = parse_yolo_labels(path, num_classes)
    if key is not None:
        cache.labels[f"{key}|{num_classes}"] = [
            boxes.tolist(),
            labels.tolist(),
            _problem_rows(problems),
        ]
        cache.dirty = True
    return boxes, labels, empty, problems


def check_split(
    name: str,
    candidates: Sequence[Candidate],
    num_classes: int,
    *,
    cache_key: str,
    workers: int | None = None,
) -> Split:
    """Check ``candidates`` and return the usable samples with every problem found."""
    snapshot = None
    if all(c.targets is None for c in candidates):  # YOLO: every target is in a file
        snapshot = snapshot_key(candidates, num_classes, f"{cache_key}|{name}")
        split = load_snapshot(snapshot, name, candidates)
        if split is not None:
            return split
    folders = {candidate.image.parent for candidate in candidates}
    caches = {folder: _Cache(str(folder)) for folder in folders}

    def check(
        candidate: Candidate, cached_only: bool = False
    ) -> tuple[Sample | None, list[Problem]]:
        cache = caches[candidate.image.parent]
        info, problems = _image(cache, candidate.image, cached_only)
        if info is None:
            return None, problems
        if candidate.targets is not None:
            boxes, labels, crowd, more = candidate.targets(info)
        else:
            boxes, labels, crowd, more = _yolo_targets(
                cache, candidate.label_file, num_classes, cached_only
            )
            if candidate.label_file is None:
                more = [
                    Problem(
                        "no-label-file",
                        str(candidate.image),
                        "no label file: used as a background image",
                        "noted",
                    )
                ]
        problems = problems + more
        if any(p.action == "skipped" for p in more):
            return None, problems
        oriented = any(p.code == ORIENTED for p in problems)
        sample = Sample(
            candidate.image,
            candidate.image_id,
            info.width,
            info.height,
            boxes,
            labels,
            crowd,
            exif_oriented=oriented,
        )
        return sample, problems

    # what the cache holds is taken on this thread (a task per file for a pool cost more than
    # the look-up: 28 s of a 118k-image set's load on the GPU machine, lab/2026-12-07-data-at-
    # scale.md); the rest is checked in parallel
    results: list[tuple[Sample | None, list[Problem]] | None] = []
    for candidate in candidates:
        try:
            results.append(check(candidate, cached_only=True))
        except _NotCached:
            results.append(None)
    missing = [i for i, r in enumerate(results) if r is None]
    if missing:
        with ThreadPoolExecutor(max_workers=workers or min(32, os.cpu_count() or 1)) as pool:
            for i, result in zip(
                missing, pool.map(check, [candidates[i] for i in missing]), strict=True
            ):
                results[i] = result
    for cache in caches.values():
        cache.save()
    samples = [s for s, _ in results if s is not None]
    problems = [p for _, ps in results for p in ps]
    split = Split(name, samples, problems, len(candidates))
    if snapshot is not None:
        save_snapshot(snapshot, split, candidates)
    return split
