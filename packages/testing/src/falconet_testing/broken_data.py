"""A YOLO dataset with one broken file per problem ``falconet data check`` must name.

Shared by the core's check tests and the end-to-end test that trains on it (a run on broken
data completes and reports what it skipped). ``EXPECTED`` maps each file to what the check
reports: ``(code, action, line)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def save(path: Path, mode: str = "RGB", size=(64, 48), **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(str(path)))
    if mode == "I;16":
        image = Image.fromarray(rng.integers(0, 65535, size[::-1], dtype=np.uint16))
    else:
        image = Image.fromarray(rng.integers(0, 255, (*size[::-1], 3), dtype=np.uint8))
        image = image.convert(mode) if mode != "RGB" else image
    image.save(path, **kwargs)
    return path


def label(root: Path, stem: str, text: str) -> None:
    path = root / "labels" / "train" / f"{stem}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


GOOD = "0 0.5 0.5 0.2 0.2\n"


def write_broken_yolo(root: Path, val: bool = False) -> Path:
    """Write the dataset under ``root``; returns its yaml (``val: true`` also names the same
    folder as the val split, so a training run can use it)."""
    images = root / "images" / "train"
    save(images / "good.jpg")
    label(root, "good", GOOD + "1 0.3 0.3 0.1 0.1\n")
    (images / "empty.jpg").write_bytes(b"")
    (images / "garbage.jpg").write_bytes(b"this is not a jpeg at all" * 10)
    whole = save(root / "source.jpg").read_bytes()
    (images / "cut.jpg").write_bytes(whole[: len(whole) // 2])
    save(images / "background.jpg")  # no label file
    bad_lines = {
        "columns": "0 0.5 0.5 0.2\n",
        "nan": "0 nan 0.5 0.2 0.2\n",
        "class": "7 0.5 0.5 0.2 0.2\n",
        "size": "1 0.5 0.5 0 0.2\n",
        "clipped": "0 0.95 0.5 0.2 0.2\n",
        "outside": "0 1.5 1.5 0.2 0.2\n",
        "duplicate": GOOD + GOOD,
    }
    for stem, text in bad_lines.items():
        save(images / f"{stem}.jpg")
        label(root, stem, text)
    exif = Image.Exif()
    exif[0x0112] = 6
    save(images / "rotated.jpg", exif=exif)
    for stem, mode, suffix in [
        ("gray", "L", "jpg"),
        ("alpha", "RGBA", "png"),
        ("palette", "P", "png"),
        ("deep", "I;16", "png"),
    ]:
        save(images / f"{stem}.{suffix}", mode=mode)
        label(root, stem, GOOD)
    label(root, "rotated", GOOD)
    splits = "train: images/train\n" + ("val: images/train\n" if val else "")
    (root / "data.yaml").write_text(f"path: .\n{splits}names: [a, b]\n")
    return root / "data.yaml"


EXPECTED = {  # file stem -> (code, action, line)
    "empty.jpg": ("zero-byte-image", "skipped", None),
    "garbage.jpg": ("corrupt-image", "skipped", None),
    "cut.jpg": ("truncated-image", "skipped", None),
    "background.jpg": ("no-label-file", "noted", None),
    "columns.txt": ("label-columns", "dropped", 1),
    "nan.txt": ("label-non-finite", "dropped", 1),
    "class.txt": ("label-class", "dropped", 1),
    "size.txt": ("label-size", "dropped", 1),
    "clipped.txt": ("label-outside", "clipped", 1),
    "outside.txt": ("label-outside", "dropped", 1),
    "duplicate.txt": ("label-duplicate", "dropped", 2),
    "rotated.jpg": ("exif-orientation", "converted", None),
    "gray.jpg": ("grayscale", "converted", None),
    "alpha.png": ("alpha", "converted", None),
    "palette.png": ("palette", "converted", None),
    "deep.png": ("16-bit", "converted", None),
}
