"""``data=shapes``: a small, learnable synthetic detection set made locally on first use.

Coloured circles, squares, triangles, crosses and rings on textured backgrounds, in YOLO
format, written once to the cache folder (``shapes-v2``). Every image comes from its own seed,
so the set is the same on every machine and for every run; nothing is downloaded.
``tools/make_shapes.py`` writes larger variants anywhere.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from falconet.paths import cache_dir

CLASSES = ("circle", "square", "triangle", "cross", "ring")
DEFAULT = {"train": 320, "val": 80}
VERSION = "shapes-v2"


def textured_background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Smooth colour noise plus a gradient and stripes: texture the model must ignore."""
    coarse = rng.uniform(40, 215, (size // 32 + 2, size // 32 + 2, 3))
    ys = np.linspace(0, coarse.shape[0] - 1.001, size)
    xs = np.linspace(0, coarse.shape[1] - 1.001, size)
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    c = coarse
    image = (
        (1 - fy) * (1 - fx) * c[y0][:, x0]
        + (1 - fy) * fx * c[y0][:, x0 + 1]
        + fy * (1 - fx) * c[y0 + 1][:, x0]
        + fy * fx * c[y0 + 1][:, x0 + 1]
    )
    stripes = 12 * np.sin(np.arange(size) * rng.uniform(0.05, 0.3))[None, :, None]
    image = image + stripes + rng.normal(0, 6, (size, size, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def _draw(draw, kind: str, box: tuple[float, float, float, float], colour: tuple) -> None:
    x0, y0, x1, y1 = box
    w = x1 - x0
    if kind == "circle":
        draw.ellipse(box, fill=colour)
    elif kind == "square":
        draw.rectangle(box, fill=colour)
    elif kind == "triangle":
        draw.polygon([(x0, y1), (x1, y1), ((x0 + x1) / 2, y0)], fill=colour)
    elif kind == "cross":
        t = w / 3
        draw.rectangle((x0 + t, y0, x1 - t, y1), fill=colour)
        draw.rectangle((x0, y0 + t, x1, y1 - t), fill=colour)
    else:  # ring
        draw.ellipse(box, outline=colour, width=max(2, int(w / 6)))


def _overlaps(box: np.ndarray, boxes: list[np.ndarray]) -> bool:
    for other in boxes:
        ix = max(0.0, min(box[2], other[2]) - max(box[0], other[0]))
        iy = max(0.0, min(box[3], other[3]) - max(box[1], other[1]))
        if ix * iy > 0.1 * min((box[2] - box[0]) ** 2, (other[2] - other[0]) ** 2):
            return True
    return False


def make_image(seed: int, size: int = 256) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """One image ``[size, size, 3]`` uint8 and its ``(class, xyxy pixels)`` objects."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    image = Image.fromarray(textured_background(rng, size))
    draw = ImageDraw.Draw(image)
    objects: list[tuple[int, np.ndarray]] = []
    for _ in range(int(rng.integers(1, 7))):
        side = rng.uniform(0.08, 0.35) * size
        x0, y0 = rng.uniform(0, size - side, 2)
        box = np.array([x0, y0, x0 + side, y0 + side])
        if _overlaps(box, [b for _, b in objects]):
            continue
        cls = int(rng.integers(len(CLASSES)))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        _draw(draw, CLASSES[cls], tuple(box.tolist()), colour)
        objects.append((cls, box))
    return np.asarray(image), objects


TRAIN_DEFAULTS = {
    "imgsz": 256,
    "epochs": 15,
    "optimizer": "adamw",
    "lr0": 0.002,
    "nbs": 16,
    "warmup_epochs": 1,
    "close_mosaic": 3,
}
"""The set's ``train_defaults:``: a CPU-sized recipe (the images are 256 px; AdamW converges in
far fewer steps than SGD on a few hundred images). What it reached is recorded in
docs/lab/2026-11-convergence-and-resume.md."""


def write_shapes(root: Path, counts: dict[str, int], size: int = 256, seed: int = 0) -> Path:
    """Write the set under ``root`` (images/, labels/, shapes.yaml); returns the yaml."""
    from PIL import Image

    for split, count in counts.items():
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        offset = 0 if split == "train" else 10_000_000  # disjoint seeds per split
        for i in range(count):
            pixels, objects = make_image(seed * 100_000_000 + offset + i, size)
            stem = f"{split}_{i:06d}"
            Image.fromarray(pixels).save(root / "images" / split / f"{stem}.jpg", quality=90)
            lines = [
                f"{c} {(b[0] + b[2]) / 2 / size:.6f} {(b[1] + b[3]) / 2 / size:.6f} "
                f"{(b[2] - b[0]) / size:.6f} {(b[3] - b[1]) / size:.6f}"
                for c, b in objects
            ]
            (root / "labels" / split / f"{stem}.txt").write_text("\n".join(lines) + "\n")
    yaml_path = root / "shapes.yaml"
    yaml_path.write_text(
        "# falconet's synthetic shapes set (falconet.data.shapes)\n"
        "path: .\n"
        + "".join(f"{s}: images/{s}\n" for s in counts)
        + "names:\n"
        + "".join(f"  {i}: {name}\n" for i, name in enumerate(CLASSES))
        + "train_defaults:\n"
        + "".join(f"  {k}: {v}\n" for k, v in TRAIN_DEFAULTS.items() if k != "imgsz")
        + f"  imgsz: {size}\n"
    )
    return yaml_path


def ensure_shapes() -> Path:
    """The yaml of the default set, building it on first use (atomically: a half-written set
    from an interrupted build is never used)."""
    final = cache_dir("datasets") / VERSION
    if (final / "shapes.yaml").exists():
        return final / "shapes.yaml"
    building = final.with_name(f"{VERSION}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    write_shapes(building, DEFAULT)
    try:
        os.replace(building, final)
    except OSError:  # another process finished first: use its copy
        shutil.rmtree(building, ignore_errors=True)
    return final / "shapes.yaml"
