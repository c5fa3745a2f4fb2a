"""Data-loader throughput: augmented training images per second, by workers and cache mode.

On COCO128 (or any data yaml) at 640 px with the training augmentation (mosaic on: four
decodes per image), batch 16, for 1, 2, 4 and 8 workers and cache ``none`` and ``ram``. Each
setting iterates ``--epochs`` epochs; the first is warm-up (worker start, first decodes) and is
left out; the rate is the median over the remaining epochs. It also times single-threaded JPEG
decoding with each library present, the measurement behind the choice of decoder.

    uv run python tools/bench_data.py ../shared/data/coco128/coco128.yaml
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import cv2
import numpy as np
import torch

from falconet.data import load_dataset
from falconet.data.loader import DetectionDataset, build_loader
from falconet.data.transforms import AugmentConfig


def decode_rates(files: list[str]) -> dict[str, float]:
    from PIL import Image

    def pillow(path: str) -> np.ndarray:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))

    def opencv(path: str) -> np.ndarray:
        return cv2.cvtColor(cv2.imread(path), cv2.COLOR_BGR2RGB)

    readers = {"pillow": pillow, "opencv": opencv}
    try:
        import torchvision.io as tio

        readers["torchvision.io"] = lambda p: tio.decode_image(tio.read_file(p))
    except Exception:  # torchvision is optional here: report what is installed
        pass
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    rates = {}
    for name, read in readers.items():
        for path in files[:8]:
            read(path)
        start = time.perf_counter()
        for path in files * 2:
            read(path)
        rates[name] = 2 * len(files) / (time.perf_counter() - start)
    cv2.setNumThreads(threads)
    return rates


def loader_rate(dataset: DetectionDataset, workers: int, batch: int, epochs: int) -> float:
    loader = build_loader(dataset, batch, workers=workers, pin_memory=False)
    rates = []
    for epoch in range(epochs):
        loader.batch_sampler.set_epoch(epoch)
        start, count = time.perf_counter(), 0
        for item in loader:
            count += len(item["images"])
        if epoch:  # epoch 0 is warm-up
            rates.append(count / (time.perf_counter() - start))
    del loader
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument(
        "--repeat", type=int, default=4, help="use the training images this many times per epoch"
    )
    parser.add_argument("--workers", default="1,2,4,8")
    args = parser.parse_args()

    split = load_dataset(args.data, splits=("train",)).splits["train"]
    samples = split.samples * args.repeat
    files = sorted({str(s.image) for s in split.samples})
    print(
        f"data: {args.data}: {len(files)} images x {args.repeat} per epoch, {args.imgsz} px, "
        f"batch {args.batch}, mosaic on, epochs {args.epochs} (first left out)"
    )
    print(
        f"machine: {os.cpu_count()} cores; python {platform.python_version()}; "
        f"torch {torch.__version__}; opencv {cv2.__version__}"
    )
    rates = decode_rates(files)
    print("decode, one thread: " + ", ".join(f"{k} {v:.0f} img/s" for k, v in rates.items()))
    print("\n| cache | " + " | ".join(f"{w} workers" for w in args.workers.split(",")) + " |")
    print("| --- |" + " --- |" * len(args.workers.split(",")))
    for cache in ("none", "ram"):
        dataset = DetectionDataset(samples, args.imgsz, augment=AugmentConfig(), cache=cache)
        cells = [
            f"{loader_rate(dataset, int(w), args.batch, args.epochs):.0f} img/s"
            for w in args.workers.split(",")
        ]
        print(f"| {cache} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
