"""Photo-like JPEGs with known boxes, and a decoded store holding the CPU cache's images:
the GPU data path's tests (``cache=gpu``, ``encoded``, ``stream``) compare its batches with
the CPU loader's on them."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import torch

from falconet.data.gpu_augment import ImageStore
from falconet.data.loader import DetectionDataset
from falconet.data.records import Sample

SIZE = 192
"""The image size the tests train at."""


def photos(folder: Path, count: int = 10, seed: int = 0) -> list[Sample]:
    """JPEGs of smooth colour fields with a few bright boxes: photo-like pixels (edges and
    gradients), known boxes."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    samples = []
    for i in range(count):
        w, h = int(rng.integers(150, 260)), int(rng.integers(120, 260))
        field = rng.integers(0, 255, (h // 16 + 2, w // 16 + 2, 3)).astype(np.uint8)
        pixels = cv2.resize(field, (w, h), interpolation=cv2.INTER_CUBIC)
        boxes = []
        for _ in range(int(rng.integers(1, 5))):
            bw, bh = rng.integers(20, 70, 2)
            x0, y0 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            pixels[y0 : y0 + bh, x0 : x0 + bw] = rng.integers(0, 255, 3)
            boxes.append([x0 / w, y0 / h, (x0 + bw) / w, (y0 + bh) / h])
        path = folder / f"{i}.jpg"
        cv2.imwrite(str(path), cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR))
        labels = rng.integers(0, 3, len(boxes)).astype(np.int64)
        samples.append(Sample(path, i, w, h, np.asarray(boxes, np.float32), labels))
    return samples


def ram_store(dataset: DetectionDataset, size: int = SIZE) -> ImageStore:
    """A store holding exactly the CPU cache's images (what both paths then augment)."""
    pixels = torch.zeros(len(dataset), size, size, 3, dtype=torch.uint8)
    for i, image in enumerate(dataset._ram):
        pixels[i, : image.shape[0], : image.shape[1]] = torch.from_numpy(image)
    return ImageStore(pixels, [image.shape[:2] for image in dataset._ram])
