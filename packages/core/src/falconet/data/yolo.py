"""The YOLO data yaml: image folders or list files, labels in the sibling ``labels/`` tree.

    path: .                  # dataset root, relative to this file (default: its folder)
    train: images/train      # a folder of images, a .txt list of image paths, or a list of these
    val: images/val
    names: [cat, dog]        # or {0: cat, 1: dog}; ``nc``, if given, must agree

The label file of ``.../images/x/0001.jpg`` is ``.../labels/x/0001.txt`` (the last ``images``
folder of the path becomes ``labels``). A yaml may take its labels from COCO JSON instead; see
:mod:`falconet.data.coco`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from falconet.data.check import Candidate
from falconet.data.images import IMAGE_SUFFIXES
from falconet.data.records import DataError


def read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DataError(f"data={path}: cannot read it ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise DataError(f"data={path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise DataError(f"data={path} must be a mapping with train, val and names")
    return data


def class_names(config: dict[str, Any], where: str) -> list[str]:
    names = config.get("names")
    if isinstance(names, dict):
        keys = sorted(names)
        if keys != list(range(len(keys))):
            raise DataError(f"{where}: names must be numbered 0..N-1 without gaps, got {keys}")
        names = [names[k] for k in keys]
    if not isinstance(names, list) or not names:
        raise DataError(f"{where}: names must be a non-empty list or a {{0: name, ...}} mapping")
    if "nc" in config and config["nc"] != len(names):
        raise DataError(f"{where}: nc is {config['nc']} but names lists {len(names)} classes")
    return [str(n) for n in names]


def dataset_root(config: dict[str, Any], yaml_path: Path) -> Path:
    root = Path(config.get("path") or ".")
    return root if root.is_absolute() else (yaml_path.parent / root).resolve()


def image_files(entry: Any, root: Path, where: str) -> list[Path]:
    """Every image named by a split entry: folders (recursive), list files, or lists of both."""
    entries = entry if isinstance(entry, list) else [entry]
    found: list[Path] = []
    for item in entries:
        path = Path(item) if Path(item).is_absolute() else root / item
        if path.is_dir():
            found += [Path(name) for name in _images_under(str(path))]
        elif path.is_file() and path.suffix == ".txt":
            lines = path.read_text(encoding="utf-8").splitlines()
            found += [
                (p if p.is_absolute() else (path.parent / p)).resolve()
                for p in (Path(line.strip()) for line in lines if line.strip())
            ]
        else:
            raise DataError(
                f"{where}: {item!r} is neither a folder of images nor a .txt list "
                f"of image paths (looked for {path})"
            )
    return found


def _images_under(folder: str) -> list[str]:
    """The image files under ``folder`` (symbolic links to folders not followed, as
    ``Path.rglob`` does), in ``Path``'s order: by path components. Strings, not ``Path``
    objects, until the end: the listing is a large part of a 100k-image set's start-up."""
    found = [
        os.path.join(top, name)
        for top, _, names in os.walk(folder)
        for name in names
        if os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES
    ]
    return sorted(found, key=lambda name: name.split(os.sep))


def _label_name(image: str) -> str:
    parts = image.split(os.sep)
    if "images" in parts[:-1]:
        parts[len(parts) - 2 - parts[-2::-1].index("images")] = "labels"
    stem, suffix = os.path.splitext(parts[-1])
    parts[-1] = (stem if suffix else parts[-1]) + ".txt"
    return os.sep.join(parts)


def label_file(image: Path) -> Path:
    """The label file of ``image``: the last ``images`` folder of its path becomes
    ``labels``, its suffix ``.txt``."""
    return Path(_label_name(str(image)))


def yolo_candidates(images: list[Path]) -> list[Candidate]:
    listed: dict[str, set[str]] = {}  # a label folder's files, listed once

    def exists(name: str) -> bool:
        folder, base = os.path.split(name)
        if folder not in listed:
            try:
                listed[folder] = set(os.listdir(folder))
            except OSError:
                listed[folder] = set()
        return base in listed[folder]

    candidates = []
    for index, image in enumerate(images):
        labels = _label_name(str(image))
        candidates.append(Candidate(image, index, Path(labels) if exists(labels) else None))
    return candidates
