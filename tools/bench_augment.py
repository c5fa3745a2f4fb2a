"""Per-sample cost of two ways of each of two augmentation steps, interleaved in one run
(median ms over samples, warm-up excluded), one OpenCV thread as in a loader worker.

* mosaic warp: the whole ``2 size`` canvas filled and pasted, then warped, against
  :func:`falconet.data.transforms.warp_mosaic` (what the loader does), which builds only the
  region the warp samples;
* HSV: :func:`falconet.data.transforms.apply_hsv` (what the loader does: split into planes,
  three lookups, merge) against one 3-channel lookup table.

    uv run python tools/bench_augment.py .data/coco128/coco128.yaml --samples 300
"""

from __future__ import annotations

import argparse
import statistics
import time

import cv2
import numpy as np

from falconet.data import load_dataset
from falconet.data.plans import Planner
from falconet.data.transforms import (
    PAD_VALUE,
    AugmentConfig,
    apply_hsv,
    hsv_tables,
    mosaic_canvas,
    read_image,
    resize_long_side,
    warp_mosaic,
)


def hsv_by_table(image: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """The same HSV gains through one 3-channel lookup table (no split and merge)."""
    table = np.ascontiguousarray(hsv_tables(gains).T).reshape(256, 1, 3)
    return cv2.cvtColor(cv2.LUT(cv2.cvtColor(image, cv2.COLOR_RGB2HSV), table), cv2.COLOR_HSV2RGB)


def timed(fn, *args) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn(*args)
    return (time.perf_counter() - start) * 1e3, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    cv2.setNumThreads(1)  # as in a loader worker
    split = load_dataset(args.data, splits=("train",)).splits["train"]
    cached = [resize_long_side(read_image(str(s.image)), args.imgsz) for s in split.samples]
    cfg, size = AugmentConfig(), args.imgsz
    times: dict[str, list[float]] = {k: [] for k in ("canvas", "region", "planes", "table")}
    shapes = [im.shape[:2] for im in cached]
    planner = Planner(split.samples, size=size, cfg=cfg, seed=0, shape=shapes.__getitem__)
    for n in range(args.warmup + args.samples):
        plan = planner.plan(n, [n % len(cached)]).sample(0)  # mosaic=1: always four tiles
        images = [cached[tile[0]] for tile in plan.tiles]
        layout, matrix = plan.layout, plan.matrix

        def whole(images=images, layout=layout, matrix=matrix):
            canvas = mosaic_canvas(images, layout, (0, 0, 2 * size, 2 * size))
            return cv2.warpAffine(
                canvas, matrix[:2], dsize=(size, size), borderValue=(PAD_VALUE,) * 3
            )

        pair = [("canvas", whole, ()), ("region", warp_mosaic, (images, layout, matrix))]
        for name, fn, fn_args in pair if n % 2 else pair[::-1]:  # alternate the order
            ms, out = timed(fn, *fn_args)
            if n >= args.warmup:
                times[name].append(ms)
        pair = [("planes", apply_hsv), ("table", hsv_by_table)]
        for name, fn in pair if n % 2 else pair[::-1]:
            ms, _ = timed(fn, out, plan.gains)
            if n >= args.warmup:
                times[name].append(ms)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.samples} samples at {size} px, one OpenCV thread, median ms per sample")
    print(
        f"mosaic warp: whole canvas {med['canvas']:.2f}, sampled region {med['region']:.2f} "
        f"({med['canvas'] / med['region']:.2f}x)"
    )
    print(
        f"HSV: three planes {med['planes']:.2f}, one table {med['table']:.2f} "
        f"({med['planes'] / med['table']:.2f}x)"
    )


if __name__ == "__main__":
    main()
