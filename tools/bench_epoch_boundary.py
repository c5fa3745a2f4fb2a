"""Loader start-up at epoch boundaries: one iterator per epoch against one iterator over the
whole run (what the trainer does), side by side in one run.

A training step is stood in for by ``time.sleep(--step-ms)`` (a GPU step leaves the host
free, as a sleep does), validation by ``--val-ms`` after each epoch. Images per second over
epochs 2..N (the first, with the workers' start, is left out), each way run ``--repeats``
times, alternated; medians.

    uv run python tools/bench_epoch_boundary.py .data/coco128/coco128.yaml --workers 2 \\
        --step-ms 60 --epochs 5
"""

from __future__ import annotations

import argparse
import statistics
import time

from falconet.data import load_dataset
from falconet.data.loader import DetectionDataset, build_loader
from falconet.data.transforms import AugmentConfig


def per_epoch(loader, epochs: int, step_s: float, val_s: float) -> list[float]:
    ends = []
    for epoch in range(epochs):
        loader.batch_sampler.set_epoch(epoch)
        for _ in loader:
            time.sleep(step_s)
        time.sleep(val_s)
        ends.append(time.perf_counter())
    return ends


def spanning(loader, epochs: int, step_s: float, val_s: float) -> list[float]:
    loader.batch_sampler.set_epochs(0, epochs)
    batches, ends = iter(loader), []
    for _ in range(epochs):
        for _ in range(loader.batch_sampler.batches_per_epoch):
            next(batches)
            time.sleep(step_s)
        time.sleep(val_s)
        ends.append(time.perf_counter())
    return ends


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--step-ms", type=float, default=60.0)
    parser.add_argument("--val-ms", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    samples = load_dataset(args.data, splits=("train",)).splits["train"].samples
    dataset = DetectionDataset(samples, args.imgsz, augment=AugmentConfig(), cache="ram")
    rates: dict[str, list[float]] = {"per-epoch": [], "spanning": []}
    for repeat in range(args.repeats):
        ways = [("per-epoch", per_epoch), ("spanning", spanning)]
        for name, way in ways if repeat % 2 == 0 else ways[::-1]:
            loader = build_loader(dataset, args.batch, workers=args.workers, pin_memory=False)
            ends = way(loader, args.epochs, args.step_ms / 1e3, args.val_ms / 1e3)
            rates[name].append(len(dataset) * (len(ends) - 1) / (ends[-1] - ends[0]))
            del loader
    per, span = (statistics.median(rates[k]) for k in ("per-epoch", "spanning"))
    steps = -(-len(dataset) // args.batch)
    print(
        f"{len(dataset)} images ({steps} steps per epoch), batch {args.batch}, {args.workers} "
        f"workers, step {args.step_ms:g} ms, validation {args.val_ms:g} ms, epochs 2-{args.epochs}"
    )
    print(
        f"one iterator per epoch: {per:.1f} img/s; one over the run: {span:.1f} img/s "
        f"({span / per:.2f}x)"
    )


if __name__ == "__main__":
    main()
