"""Write an N-image YOLO dataset of real JPEG files, made from a small one, for benchmarks at
COCO's scale without a network.

    python tools/make_scale_set.py --source DATA.yaml --images N --out DIR [--val K] [--seed S]

Each image is a source image (any dataset falconet reads: its train split) cropped to a random
60-100% of each side, mirrored with probability 0.5, rescaled to COCO train2017's sizes and
re-encoded as a baseline 4:2:0 JPEG, the boxes carried through the same crop, flip and scale.
DIR gets ``images/train``, ``labels/train`` (N images), ``images/val``, ``labels/val`` (K) and
``data.yaml`` naming the source's classes. The data benchmarks (``tools/bench_data.py
--tiers``, ``tools/bench_scale.py``) run on it where an epoch of COCO128 is too small to show
how a store behaves at 118k images.

Sizes: COCO train2017's images have a long side of 640 px nearly all; so do 90% here, the
other 10% a long side drawn from 480-639. The short side is the crop's, so it follows the
source's aspect ratios and the crop (COCO128's are COCO's own). Quality: drawn from 95-99:
from COCO128 that gives files of ~146 KiB on average (0.52 bytes a pixel; COCO128's own 0.61;
COCO train2017's files average ~160 KB), where 80-95 gave half of that, the crop and rescale
having smoothed the pixels; the generated set's bytes per pixel are printed beside the
source's. A box is kept where at least 20% of its area and 2 px of each side survive the crop.
Every image is a function of ``(seed, split, index)``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from multiprocessing import get_context
from pathlib import Path

import cv2
import numpy as np

LONG_SIDE = 640
SMALLER_SHARE = 0.1
"""The share of images with a long side below :data:`LONG_SIDE` (drawn from 480-639)."""
QUALITY = (95, 99)
"""JPEG qualities drawn from (module docstring)."""
KEEP_AREA = 0.2
MIN_SIDE = 2.0

_sources: list = []  # (path, boxes, labels) per source, set in each worker
_decoded: dict[int, np.ndarray] = {}  # the worker's decoded sources, the oldest dropped first
DECODED_HELD = 256
"""Decoded sources a worker holds (COCO128 whole; a large source is decoded again as drawn)."""


def _init(sources: list) -> None:
    global _sources
    _sources = sources
    cv2.setNumThreads(1)


def transform_boxes(
    boxes: np.ndarray, crop, flip: bool, scale: float, size
) -> tuple[np.ndarray, np.ndarray]:
    """``boxes [n, 4]`` xyxy pixels of the source into the output's pixels: cropped to
    ``crop = (x0, y0, x1, y1)``, mirrored, scaled; the rows that survive (module docstring)."""
    x0, y0, x1, y1 = crop
    clipped = boxes.copy()
    clipped[:, [0, 2]] = clipped[:, [0, 2]].clip(x0, x1) - x0
    clipped[:, [1, 3]] = clipped[:, [1, 3]].clip(y0, y1) - y0
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    kept_area = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1])
    if flip:
        clipped[:, [0, 2]] = (x1 - x0) - clipped[:, [2, 0]]
    clipped *= scale
    w, h = size
    clipped[:, [0, 2]] = clipped[:, [0, 2]].clip(0, w)
    clipped[:, [1, 3]] = clipped[:, [1, 3]].clip(0, h)
    keep = (kept_area >= KEEP_AREA * np.maximum(area, 1e-9)) & (
        (clipped[:, 2] - clipped[:, 0] >= MIN_SIDE) & (clipped[:, 3] - clipped[:, 1] >= MIN_SIDE)
    )
    return clipped, keep


def make_one(job: tuple[int, str, int, Path]) -> int:
    """Write image ``index`` of ``split`` and its labels; the JPEG's bytes."""
    seed, split, index, out = job
    rng = np.random.default_rng([seed, 0 if split == "train" else 1, index])
    source = int(rng.integers(len(_sources)))
    if source not in _decoded:
        from falconet.data.transforms import read_image

        if len(_decoded) >= DECODED_HELD:  # a large source: hold a bounded number decoded
            _decoded.pop(next(iter(_decoded)))
        _decoded[source] = read_image(_sources[source][0])
    image = _decoded[source]
    _, boxes, labels = _sources[source]
    h, w = image.shape[:2]
    cw, ch = (rng.uniform(0.6, 1.0, 2) * (w, h)).astype(int).clip(16)
    x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    flip = bool(rng.random() < 0.5)
    long = LONG_SIDE if rng.random() >= SMALLER_SHARE else int(rng.integers(480, LONG_SIDE))
    scale = long / max(cw, ch)
    size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
    quality = int(rng.integers(QUALITY[0], QUALITY[1] + 1))
    crop = image[y0 : y0 + ch, x0 : x0 + cw]
    if flip:
        crop = crop[:, ::-1]
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    pixels = cv2.resize(np.ascontiguousarray(crop), size, interpolation=interp)
    ok, data = cv2.imencode(
        ".jpg", cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    if not ok:
        raise RuntimeError(f"cannot encode image {index}")
    stem = f"{index:012d}"
    (out / "images" / split / f"{stem}.jpg").write_bytes(data.tobytes())
    pixel_boxes = boxes * np.array([w, h, w, h], np.float32)
    moved, keep = transform_boxes(pixel_boxes, (x0, y0, x0 + cw, y0 + ch), flip, scale, size)
    rows = []
    for (a, b, c, d), label in zip(moved[keep], labels[keep], strict=True):
        cx, cy = (a + c) / 2 / size[0], (b + d) / 2 / size[1]
        rows.append(f"{label} {cx:.6f} {cy:.6f} {(c - a) / size[0]:.6f} {(d - b) / size[1]:.6f}")
    (out / "labels" / split / f"{stem}.txt").write_text("".join(r + "\n" for r in rows))
    return len(data)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, help="a data yaml falconet reads")
    parser.add_argument("--images", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--val", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--force", action="store_true", help="replace the images and labels of a non-empty --out"
    )
    args = parser.parse_args(argv)
    if args.images < 1 or args.val < 0:
        parser.error(f"--images {args.images} --val {args.val}: need at least one image")
    if args.out.exists() and any(args.out.iterdir()) and not args.force:
        parser.error(f"--out {args.out} is not empty; give an empty folder or --force")
    for folder in ("images", "labels"):  # --force: an earlier, larger set's files go
        shutil.rmtree(args.out / folder, ignore_errors=True)
    from falconet.data.resolve import load_dataset

    dataset = load_dataset(args.source, splits=("train",))
    samples = dataset.splits["train"].samples
    if not samples:
        parser.error(f"--source {args.source}: its train split has no usable image")
    sources = [(str(s.image), s.boxes, s.labels) for s in samples]
    for split in ("train", "val"):
        (args.out / "images" / split).mkdir(parents=True, exist_ok=True)
        (args.out / "labels" / split).mkdir(parents=True, exist_ok=True)
    import yaml

    config = {"path": ".", "train": "images/train", "val": "images/val", "names": dataset.names}
    (args.out / "data.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    jobs = [(args.seed, "train", i, args.out) for i in range(args.images)]
    jobs += [(args.seed, "val", i, args.out) for i in range(args.val)]
    start = time.perf_counter()
    # spawned, not forked: a fork of a process with threads (torch's, a test runner's) can
    # copy a lock another thread holds, and the worker then waits on it for ever
    with get_context("spawn").Pool(args.workers, initializer=_init, initargs=(sources,)) as pool:
        sizes = pool.map(make_one, jobs, chunksize=64)
    seconds = time.perf_counter() - start
    source_bytes = [Path(s.image).stat().st_size / (s.width * s.height) for s in samples]
    made = np.array(sizes[: args.images], np.float64)
    pixels = []
    for i in range(min(args.images, 200)):
        h, w = cv2.imread(str(args.out / "images" / "train" / f"{i:012d}.jpg")).shape[:2]
        pixels.append(sizes[i] / (w * h))
    summary = {
        "images": args.images,
        "val": args.val,
        "seconds": round(seconds, 1),
        "images_per_s": round(len(jobs) / seconds),
        "gib": round(float(sum(sizes)) / 2**30, 2),
        "mean_kib": round(float(made.mean()) / 1024, 1),
        "bytes_per_pixel": round(float(np.mean(pixels)), 3),
        "source_bytes_per_pixel": round(float(np.mean(source_bytes)), 3),
    }
    print(
        f"make_scale_set: {len(jobs)} images in {seconds:.1f} s ({summary['images_per_s']}/s), "
        f"{summary['gib']} GiB, mean {summary['mean_kib']} KiB, {summary['bytes_per_pixel']} "
        f"bytes/pixel (source {summary['source_bytes_per_pixel']})",
        file=sys.stderr,
    )
    return summary


if __name__ == "__main__":
    main()
