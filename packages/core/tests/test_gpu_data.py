"""``cache=gpu`` on the CPU: the batched augmentation (:mod:`falconet.data.gpu_augment`) and the
GPU loader run on any torch device, so here they are compared with the CPU loader on the same
images and the same plans: targets equal exactly, pixels within interpolation rounding. The
store's fill decodes with the CPU decoder here (nvJPEG needs a GPU); a file that decodes
nowhere is left out with a warning. The GPU side (nvJPEG, speed) is measured by
tools/bench_data.py on the GPU machine."""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from falconet.data.gpu_augment import ImageStore
from falconet.data.gpu_cache import check_fits, fill_store, store_bytes
from falconet.data.gpu_loader import GpuLoader
from falconet.data.loader import DetectionDataset, build_loader, resized_shape
from falconet.data.records import DataError, Sample
from falconet.data.transforms import AugmentConfig

SIZE = 192


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FALCONET_CACHE_DIR", str(tmp_path / "cache"))


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


def ram_store(dataset: DetectionDataset) -> ImageStore:
    """A store holding exactly the CPU cache's images (what both paths then augment)."""
    pixels = torch.zeros(len(dataset), SIZE, SIZE, 3, dtype=torch.uint8)
    for i, image in enumerate(dataset._ram):
        pixels[i, : image.shape[0], : image.shape[1]] = torch.from_numpy(image)
    return ImageStore(pixels, [image.shape[:2] for image in dataset._ram])


@pytest.mark.parametrize("mosaic", [1.0, 0.5, 0.0])
def test_gpu_batches_are_the_cpu_loaders_targets_and_pixels_up_to_rounding(tmp_path, mosaic):
    samples = photos(tmp_path / "img")
    cfg = AugmentConfig(mosaic=mosaic, degrees=10.0)
    dataset = DetectionDataset(samples, SIZE, augment=cfg, cache="ram", seed=5)
    cpu = build_loader(dataset, 4, seed=5)
    gpu = GpuLoader(dataset, ram_store(dataset), 4, seed=5)
    for loader in (cpu, gpu):
        loader.batch_sampler.set_epochs(0, 2)
    differences = []
    batches = 0
    for a, b in zip(cpu, gpu, strict=True):
        assert set(a) == set(b)
        for key in a:
            if key != "images":
                assert torch.equal(a[key], b[key]), key  # the plans' boxes: exactly
        assert b["images"].shape == a["images"].shape == (len(a["counts"]), 3, SIZE, SIZE)
        assert b["images"].dtype == torch.uint8
        assert b["images"].is_contiguous(memory_format=torch.channels_last)
        differences.append((a["images"].int() - b["images"].int()).abs().flatten())
        batches += 1
    assert batches == 2 * 3  # 10 images in batches of 4, two epochs
    diff = torch.cat(differences).float()
    # OpenCV warps in fixed point (1/32 px) and converts HSV through integer tables; the GPU
    # path in float32 and rounds per stage: measured here a mean of 0.24-0.29 levels, 0.25-0.37%
    # of the values more than 2 levels apart, the largest 15-17 at the boxes' sharp edges
    assert diff.mean() < 0.4
    assert (diff > 2).float().mean() < 0.006
    assert torch.quantile(diff[::7], 0.999) <= 8


def test_the_gpu_loader_resumes_mid_epoch_and_shards_like_the_cpu_loader(tmp_path):
    samples = photos(tmp_path / "img", count=9)
    dataset = DetectionDataset(samples, SIZE, augment=AugmentConfig(), cache="ram", seed=1)
    for rank in (0, 1):
        cpu = build_loader(dataset, 2, seed=1, rank=rank, world_size=2)
        gpu = GpuLoader(dataset, ram_store(dataset), 2, seed=1, rank=rank, world_size=2)
        for loader in (cpu, gpu):
            loader.batch_sampler.set_epochs(1, 2, start=2)
        ids = [[b["image_ids"].tolist() for b in loader] for loader in (cpu, gpu)]
        assert ids[0] == ids[1] and len(ids[0]) == 2  # 5 per rank, 2 skipped


def test_the_store_fill_decodes_resizes_and_leaves_out_what_cannot_decode(tmp_path, caplog):
    samples = photos(tmp_path / "img", count=4)
    broken = tmp_path / "img" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    samples.append(
        Sample(broken, 99, 200, 100, np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
    )
    with caplog.at_level(logging.WARNING, logger="falconet.data"):
        filled = fill_store(samples, SIZE, torch.device("cpu"))
    assert [s.image_id for s in filled.samples] == [0, 1, 2, 3]
    assert filled.left_out == [str(broken)] and filled.on_cpu == 4 and filled.on_gpu == 0
    assert "1 image(s) could not be decoded and are left out" in caplog.text
    ram = DetectionDataset(samples[:4], SIZE, cache="ram")
    for i, sample in enumerate(filled.samples):
        h, w = filled.store.shapes[i]
        assert (h, w) == resized_shape(sample, SIZE) == ram._ram[i].shape[:2]
        stored = filled.store.pixels[i, :h, :w].int()
        # torch's area resampling is not OpenCV's INTER_AREA, by a level or two on average
        assert (stored - torch.from_numpy(ram._ram[i]).int()).abs().float().mean() < 3
        assert not filled.store.pixels[i, h:].any() and not filled.store.pixels[i, :, w:].any()


def test_a_store_too_large_for_the_gpu_is_refused_with_the_numbers():
    assert store_bytes(1000, 640) == 1000 * 640 * 640 * 3
    gib = 2**30
    check_fits(1000, 640, free=40 * gib, total=80 * gib, where="cuda:0")  # 1.1 GiB: fine
    with pytest.raises(DataError, match=r"118000 images at imgsz=640 need 135\.0 GiB .*cache=ram"):
        check_fits(118_000, 640, free=120 * gib, total=141 * gib, where="cuda:0")
