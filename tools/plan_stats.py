"""The augmentation plans' statistics, planned per sample (the CPU loader) and per batch (the
GPU loader): the same distributions from differently keyed draws?

    python tools/plan_stats.py --data ../shared/data/coco128/coco128.yaml --out stats.json

The CPU loader plans one sample at a time, its draws a function of ``(seed, epoch, index)``;
``cache=gpu``'s loader plans a batch at once from ``(seed, epoch, *indices)``
(:mod:`falconet.data.plans`). Both train on draws of the same distributions, so over many
epochs their plans must agree in what a trained network sees: boxes per sample, box sizes,
flips, mosaics. Per epoch (the training set repeated ``--repeat`` times, the run's default
augmentation keys, the sampler's order), for each path: the mean boxes per sample, the
median box area in output pixels, the share of samples flipped and of mosaics; printed and
written as the mean and the standard deviation over epochs. Nothing is decoded: a plan needs
the images' sizes only, which the dataset check measured. CPU only, a few seconds.

With ``--buckets``, also the target buckets ``(M, N)`` (:mod:`falconet.data.targets`) of
``cache=gpu``'s batches over a run of ``--epochs`` with the run's ``close_mosaic``: how many
batches fall in each and the epoch (1-based) and batch where each first comes, which says
what ``graph=whole-step`` will record and when (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import numpy as np
import torch

from falconet.data.loader import DetectionDataset, padded_targets
from falconet.data.plans import BatchPlan
from falconet.data.resolve import load_dataset
from falconet.data.sampler import EpochSampler
from falconet.data.targets import Targets
from falconet.training.config import TrainConfig
from falconet.training.loaders import augment_config


def epoch_stats(plans: list[BatchPlan]) -> dict[str, float]:
    """One epoch's figures over every sample of ``plans``."""
    counts = np.concatenate([p.counts for p in plans])
    boxes = np.concatenate([p.boxes for p in plans])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    flipped = np.concatenate([p.matrix[:, 0, 0] < 0 for p in plans])  # x mirrored
    mosaic = np.concatenate([p.mosaic for p in plans])
    return {
        "boxes_per_sample": float(counts.mean()),
        "median_box_area_px2": float(np.median(areas)),
        "flipped": float(flipped.mean()),
        "mosaic": float(mosaic.mean()),
    }


def bucket_counts(dataset: DetectionDataset, sampler: EpochSampler, batch: int, epochs: int):
    """Each target bucket of the batches of ``epochs``: its batch count and where it first
    comes (epoch from 1, batch from 1 in that epoch), smallest box count first."""
    seen: dict[tuple[int, int], dict[str, int]] = {}
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        order = [index for _, index in sampler]
        for i in range(0, len(order), batch):
            plan = dataset.plan(epoch, order[i : i + batch])
            # padded as cache=gpu's loader pads them (GpuLoader.host_part)
            padded = padded_targets(
                *(torch.from_numpy(a) for a in (plan.boxes, plan.labels, plan.counts))
            )
            bucket = Targets.from_batch(padded).bucket
            entry = seen.setdefault(
                bucket, {"batches": 0, "epoch": epoch + 1, "batch": i // batch + 1}
            )
            entry["batches"] += 1
    return {f"{m},{n}": seen[(m, n)] for m, n in sorted(seen, key=lambda b: b[::-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a dataset yaml (YOLO) or COCO JSON")
    parser.add_argument("--repeat", type=int, default=4, help="the train split this many times")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16, help="the GPU loader's batch")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    parser.add_argument(
        "--buckets",
        action="store_true",
        help="also the target buckets of cache=gpu's batches over the run (module docstring)",
    )
    args = parser.parse_args()

    cfg = TrainConfig(data=args.data, imgsz=args.imgsz, seed=args.seed)
    samples = load_dataset(args.data, splits=("train",)).splits["train"].samples * args.repeat
    dataset = DetectionDataset(samples, args.imgsz, augment=augment_config(cfg), seed=args.seed)
    sampler = EpochSampler(len(dataset), shuffle=True, seed=args.seed)
    per_epoch: dict[str, list[dict[str, float]]] = {"per_sample": [], "per_batch": []}
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        order = [index for _, index in sampler]
        batches = [order[i : i + args.batch] for i in range(0, len(order), args.batch)]
        per_epoch["per_sample"].append(epoch_stats([dataset.plan(epoch, [i]) for i in order]))
        per_epoch["per_batch"].append(epoch_stats([dataset.plan(epoch, b) for b in batches]))
    summary = {
        path: {
            key: {
                "mean": statistics.fmean(row[key] for row in rows),
                "std": statistics.stdev(row[key] for row in rows),
            }
            for key in rows[0]
        }
        for path, rows in per_epoch.items()
    }
    for path, figures in summary.items():
        shown = ", ".join(f"{k} {v['mean']:.4g} ± {v['std']:.2g}" for k, v in figures.items())
        print(f"{path}: {shown}")
    buckets = None
    if args.buckets:  # as a run plans them: mosaic off for its last close_mosaic epochs
        run = TrainConfig(data=args.data, imgsz=args.imgsz, seed=args.seed, epochs=args.epochs)
        closing = DetectionDataset(
            samples,
            args.imgsz,
            augment=augment_config(run),
            seed=args.seed,
            close_mosaic_from=run.epochs - run.close_mosaic if run.close_mosaic else None,
        )
        buckets = bucket_counts(closing, sampler, args.batch, args.epochs)
        for bucket, where in buckets.items():
            print(
                f"bucket ({bucket}): batches {where['batches']}, "
                f"first in epoch {where['epoch']} at batch {where['batch']}"
            )
    if args.out:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        record = {
            "settings": settings,
            "samples": len(dataset),
            "versions": {"python": platform.python_version(), "torch": torch.__version__},
            "machine": platform.processor() or platform.machine(),
            "summary": summary,
            "per_epoch": per_epoch,
            "buckets": buckets,
        }
        args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
