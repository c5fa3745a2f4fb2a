"""Benchmark the eval backends on a COCO-val-shaped synthetic set, side by side in one run.

The set (seeded, made here, no download): 5,000 images, about 35k ground-truth boxes of 80
classes with about 1% crowd regions, and 100 detections per image (500k): jittered true
positives, duplicates and false positives. For every installed backend it times
``backend.evaluate`` (building the library's structures from falconet's arrays, matching,
accumulating and summarising), median of ``--repeats`` runs after one warm-up on a small set,
and checks its 12 stats against pycocotools' on the same data. falconet's own cost is timed
apart: collecting 5,000 per-image torch outputs with the accumulator and converting them to
the contract (xyxy -> xywh, labels -> category ids). The outputs sit on ``--device`` (default:
the GPU when there is one), where a validation run's postprocess leaves them.

    uv run --with hotcoco --with vernier python tools/bench_eval.py --threads 2

``--json PATH`` also writes the raw numbers (every repeat's seconds, versions, settings) for
docs/bench-results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np
import torch

from falconet.evaluation import EvalBackendUnavailable
from falconet.evaluation.accumulator import DetectionAccumulator
from falconet.evaluation.contract import Detections, GroundTruth
from falconet.plugins import get_plugins


def make_set(images: int, dets_per_image: int, seed: int = 0) -> tuple[GroundTruth, list]:
    """Ground truth and per-image detector outputs (torch, xyxy, contiguous labels)."""
    rng = np.random.default_rng(seed)
    heights = rng.choice([360, 427, 480, 500, 640], images)
    widths = rng.choice([480, 500, 612, 640], images)
    per_image = rng.poisson(7, images)
    n = int(per_image.sum())
    owner = np.repeat(np.arange(images), per_image)
    side = np.exp(rng.uniform(np.log(8), np.log(400), (n, 2)))  # small, medium and large
    wh = np.minimum(side, np.c_[widths[owner], heights[owner]] - 1)
    xy = rng.uniform(0, 1, (n, 2)) * (np.c_[widths[owner], heights[owner]] - wh)
    boxes = np.c_[xy, wh]
    labels = rng.integers(0, 80, n)
    gt = GroundTruth(
        image_ids=np.arange(images) + 1,
        image_sizes=np.c_[heights, widths],
        category_ids=np.arange(80) + 1,
        category_names=[f"class{i}" for i in range(80)],
        ann_image_ids=owner + 1,
        ann_category_ids=labels + 1,
        ann_boxes=boxes,
        ann_areas=wh.prod(1) * rng.uniform(0.5, 0.9, n),
        ann_iscrowd=rng.random(n) < 0.01,
    )
    outputs = []
    start = np.r_[0, np.cumsum(per_image)]
    for i in range(images):
        k = dets_per_image
        src = rng.integers(start[i], max(start[i + 1], start[i] + 1), k)
        true_like = (rng.random(k) < 0.4) & (per_image[i] > 0)
        base = np.where(
            true_like[:, None],
            boxes[np.minimum(src, n - 1)],
            np.c_[
                rng.uniform(0, widths[i] / 2, k),
                rng.uniform(0, heights[i] / 2, k),
                rng.uniform(4, widths[i] / 2, k),
                rng.uniform(4, heights[i] / 2, k),
            ],
        )
        base = base + rng.normal(0, 0.06, (k, 4)) * np.c_[base[:, 2:], base[:, 2:]]
        base[:, 2:] = np.abs(base[:, 2:]) + 1
        cls = np.where(
            true_like & (rng.random(k) < 0.9),
            labels[np.minimum(src, n - 1)],
            rng.integers(0, 80, k),
        )
        xyxy = np.c_[base[:, :2], base[:, :2] + base[:, 2:]]
        outputs.append(
            {
                "boxes": torch.from_numpy(xyxy).float(),
                "scores": torch.from_numpy(np.round(rng.random(k), 3)).float(),
                "labels": torch.from_numpy(cls),
            }
        )
    return gt, outputs


def accumulate(gt: GroundTruth, outputs: list, batch: int = 32) -> tuple[Detections, float]:
    """The detections, and the seconds spent in ``add`` (the rest is the conversion)."""
    acc = DetectionAccumulator(gt.category_ids)
    ids = gt.image_ids.tolist()
    t0 = time.perf_counter()
    for s in range(0, len(outputs), batch):
        acc.add(ids[s : s + batch], outputs[s : s + batch])
    return acc.detections(), time.perf_counter() - t0


def timed(fn, repeats: int) -> tuple[float, object, list[float]]:
    """The median seconds of ``repeats`` calls, the last result, and every call's seconds."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result, times


def cpu_model() -> str:
    """The CPU's model name (what ``lscpu`` shows), where Linux tells it."""
    try:
        with open("/proc/cpuinfo") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if "model name" in line]
    except OSError:
        names = []
    return names[0] if names else platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--dets-per-image", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backends", default="", help="comma list (default: all installed)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default="", help="also write the raw numbers to this file")
    args = parser.parse_args()

    plugins = get_plugins()
    names = args.backends.split(",") if args.backends else plugins.eval_backends.names()
    gt, outputs = make_set(args.images, args.dets_per_image)
    outputs = [{k: v.to(args.device) for k, v in out.items()} for out in outputs]
    accumulate(gt, outputs)  # warm-up (first CUDA kernels)
    overhead, (dets, adding), overhead_runs = timed(lambda: accumulate(gt, outputs), args.repeats)
    small_gt, small_out = make_set(50, 20, seed=1)
    small_dets, _ = accumulate(small_gt, small_out)
    print(
        f"set: {len(gt.image_ids)} images, {len(gt.ann_image_ids)} ground-truth boxes "
        f"({int(gt.ann_iscrowd.sum())} crowd), {len(dets)} detections, 80 classes"
    )
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"python {platform.python_version()}; threads={args.threads}; "
        f"median of {args.repeats}; detector outputs on {args.device}"
    )
    print(f"falconet accumulate + convert: {overhead:.3f} s (add: {adding:.3f} s)")
    rows, reference, raw = [], None, []
    for name in sorted(names, key=lambda n: n != "pycocotools"):
        backend = plugins.eval_backends.get(name)
        try:
            version = backend.version()
        except EvalBackendUnavailable as exc:
            print(f"skip {name}: {exc}")
            continue
        backend.evaluate(small_gt, small_dets, threads=args.threads)  # warm-up
        seconds, result, runs = timed(
            lambda b=backend: b.evaluate(gt, dets, threads=args.threads), args.repeats
        )
        if name == "pycocotools":
            reference = result
        same = "-" if reference is None else ("yes" if result.stats == reference.stats else "NO")
        rows.append((name, version, seconds, same))
        raw.append(
            {
                "backend": name,
                "version": version,
                "median_s": seconds,
                "runs_s": runs,
                "same_as_pycocotools": same,
                "stats": dict(result.stats),
            }
        )
    base = next((s for n, _, s, _ in rows if n == "pycocotools"), None)
    print(
        "\n| backend | version | evaluate (s) | vs pycocotools | falconet overhead | "
        "12 stats == pycocotools |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, version, seconds, same in rows:
        ratio = f"{base / seconds:.1f}x faster" if base else "-"
        print(
            f"| {name} | {version} | {seconds:.3f} | {ratio} | "
            f"{100 * overhead / seconds:.0f}% | {same} |"
        )
    if args.json:
        document = {
            "script": "tools/bench_eval.py",
            "settings": vars(args),
            "machine": {
                "processor": platform.processor() or platform.machine(),
                "cpu": cpu_model(),
                "cores": os.cpu_count(),
                "python": platform.python_version(),
                "torch": torch.__version__,
                "numpy": np.__version__,
            },
            "set": {
                "images": len(gt.image_ids),
                "ground_truth_boxes": len(gt.ann_image_ids),
                "crowd": int(gt.ann_iscrowd.sum()),
                "detections": len(dets),
            },
            "falconet_accumulate_convert_s": {"median": overhead, "runs": overhead_runs},
            "falconet_add_s": adding,
            "backends": raw,
        }
        with open(args.json, "w") as handle:
            json.dump(document, handle, indent=1)
            handle.write("\n")


if __name__ == "__main__":
    main()
