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
            found += sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
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


def label_file(image: Path) -> Path:
    parts = list(image.parts)
    if "images" not in parts:
        return image.with_suffix(".txt")
    index = len(parts) - 1 - parts[::-1].index("images")
    parts[index] = "labels"
    return Path(*parts).with_suffix(".txt")


def yolo_candidates(images: list[Path]) -> list[Candidate]:
    candidates = []
    for index, image in enumerate(images):
        labels = label_file(image)
        candidates.append(Candidate(image, index, labels if labels.exists() else None))
    return candidates
