"""The loader: boxes follow the pixels through mosaic and affine, batches are deterministic,
close_mosaic reaches persistent workers, the sampler resumes and shards, caches agree."""

from __future__ import annotations

import multiprocessing
import os
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from falconet.data.loader import (
    DetectionDataset,
    build_loader,
    collate,
    stop_workers,
    worker_start_method,
)
from falconet.data.records import Sample
from falconet.data.sampler import EpochSampler
from falconet.data.transforms import AugmentConfig

NO_COLOUR = AugmentConfig(hsv_h=0, hsv_s=0, hsv_v=0)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FALCONET_CACHE_DIR", str(tmp_path / "cache"))


def known_pixels(folder: Path, count: int = 12, seed: int = 0) -> list[Sample]:
    """Black images with pure red rectangles: the object pixels are known exactly."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    samples = []
    for i in range(count):
        w, h = int(rng.integers(200, 320)), int(rng.integers(160, 320))
        pixels = np.zeros((h, w, 3), np.uint8)
        boxes = []
        for _ in range(int(rng.integers(1, 4))):
            bw, bh = rng.integers(40, 90, 2)
            x0, y0 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            if pixels[y0 : y0 + bh, x0 : x0 + bw].any():
                continue
            pixels[y0 : y0 + bh, x0 : x0 + bw] = (255, 0, 0)
            boxes.append([x0 / w, y0 / h, (x0 + bw) / w, (y0 + bh) / h])
        path = folder / f"{i}.png"
        Image.fromarray(pixels).save(path)
        samples.append(
            Sample(path, i, w, h, np.asarray(boxes, np.float32), np.zeros(len(boxes), np.int64))
        )
    return samples


def red(image: torch.Tensor) -> np.ndarray:
    pixels = image.numpy().astype(int)  # HWC
    return (pixels[..., 0] > 160) & (pixels[..., 1] < 90) & (pixels[..., 2] < 90)


@pytest.mark.parametrize(
    ("mosaic", "degrees", "fill"),
    [
        (1.0, 0.0, 0.8),
        (0.0, 0.0, 0.8),  # axis-aligned: each box is (almost) all object
        (1.0, 10.0, 0.3),
        (0.0, 10.0, 0.3),  # rotated: the box encloses a tilted rectangle
    ],
)
def test_boxes_follow_the_pixels_through_mosaic_and_affine(tmp_path, mosaic, degrees, fill):
    samples = known_pixels(tmp_path / "img")
    # scale within 0.75..1.25 and no translation keep the mosaic canvas's edges outside the
    # output, so an object cut by the output's edge is the only way to lose a box
    cfg = AugmentConfig(
        mosaic=mosaic, hsv_h=0, hsv_s=0, hsv_v=0, degrees=degrees, scale=0.25, translate=0.0
    )
    dataset = DetectionDataset(samples, 160, augment=cfg, seed=3)
    boxes_seen = 0
    for index in range(len(samples)):
        for epoch in range(3):
            item = dataset[(epoch, index)]
            assert item["mosaic"] is (mosaic == 1.0)
            mask = red(item["image"])
            covered = np.zeros_like(mask)
            for x0, y0, x1, y1 in item["boxes"].numpy():
                box = mask[int(np.ceil(y0)) : int(y1), int(np.ceil(x0)) : int(x1)]
                assert box.mean() > fill
                covered[int(y0) : int(np.ceil(y1)) + 1, int(x0) : int(np.ceil(x1)) + 1] = True
                boxes_seen += 1
            # object pixels outside every box are edge blur, or slivers of objects the output's
            # edge cut to under 10% of their area (dropped on purpose): they touch the edge
            stray = (mask & ~covered).astype(np.uint8)
            _, _, stats, _ = cv2.connectedComponentsWithStats(stray)
            for x, y, w, h, area in stats[1:]:
                on_edge = x == 0 or y == 0 or x + w == 160 or y + h == 160
                assert on_edge or area <= 30, (index, epoch, x, y, w, h, area)
    assert boxes_seen > 30


def test_validation_letterbox_maps_back_to_the_original(tmp_path):
    samples = known_pixels(tmp_path / "img", count=3)
    dataset = DetectionDataset(samples, 128)
    for sample, item in zip(samples, (dataset[i] for i in range(3)), strict=True):
        (top_pad, left_pad), ratio = item["pad"][::-1], item["ratio"]
        back = (item["boxes"].numpy() - [left_pad, top_pad, left_pad, top_pad]) / ratio
        want = sample.boxes * [sample.width, sample.height, sample.width, sample.height]
        np.testing.assert_allclose(back, want, atol=1.0)


def batches(loader, epochs=(0, 1)):
    out = []
    for epoch in epochs:
        loader.batch_sampler.set_epoch(epoch)
        out += [b for b in loader]
    return out


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True)
    )


def test_same_seed_same_batches_for_0_1_and_2_workers(tmp_path):
    dataset = DetectionDataset(
        known_pixels(tmp_path / "img", 10), 96, augment=AugmentConfig(), seed=7
    )
    runs = [batches(build_loader(dataset, 4, workers=w, seed=7)) for w in (0, 1, 2)]
    assert same(runs[0], runs[1]) and same(runs[0], runs[2])
    other_seed = batches(
        build_loader(
            DetectionDataset(dataset.samples, 96, seed=8, augment=AugmentConfig()), 4, seed=8
        )
    )
    assert not same(runs[0], other_seed)


def test_close_mosaic_reaches_persistent_workers(tmp_path):
    dataset = DetectionDataset(
        known_pixels(tmp_path / "img", 8), 96, augment=AugmentConfig(), close_mosaic_from=2
    )
    loader = build_loader(dataset, 4, workers=2)
    for epoch, expect in ((0, True), (1, True), (2, False), (3, False)):
        loader.batch_sampler.set_epoch(epoch)
        flags = torch.cat([b["mosaic"] for b in loader])
        assert flags.all().item() is expect and flags.any().item() is expect, epoch


def test_sampler_resumes_mid_epoch_and_shards_ranks():
    full = list(EpochSampler(10, seed=1))
    resumed = EpochSampler(10, seed=1)
    resumed.set_epoch(0, start=6)
    assert list(resumed) == full[6:] and len(resumed) == 4
    shares = [list(EpochSampler(10, seed=1, rank=r, world_size=3)) for r in range(3)]
    assert [len(s) for s in shares] == [4, 4, 4]  # padded to equal length
    assert {i for s in shares for _, i in s} == set(range(10))
    second = EpochSampler(10, seed=1)
    second.set_epoch(1)
    assert [i for _, i in second] != [i for _, i in full]


def test_ram_and_disk_caches_give_the_same_batches(tmp_path):
    samples = known_pixels(tmp_path / "img", 6)
    runs = {}
    for mode in ("none", "ram", "disk"):
        dataset = DetectionDataset(samples, 96, augment=AugmentConfig(), cache=mode, seed=1)
        runs[mode] = batches(build_loader(dataset, 3, seed=1), epochs=(0,))
    assert same(runs["none"], runs["ram"]) and same(runs["none"], runs["disk"])
    cached = list((tmp_path / "cache" / "images").rglob("*.npy"))
    assert len(cached) == 6  # in the cache folder, not beside the images
    assert not list((tmp_path / "img").glob("*.npy"))


def test_collate_pads_targets_to_a_bucket(tmp_path):
    dataset = DetectionDataset(known_pixels(tmp_path / "img", 4), 96)
    batch = collate([dataset[i] for i in range(4)])
    counts = batch["counts"]
    assert batch["boxes"].shape == (4, 8, 4) and batch["labels"].shape == (4, 8)
    real = batch["box_images"] < 4  # the per-box view lists the same boxes
    assert real.sum() == counts.sum() and len(batch["box_images"]) >= counts.sum()
    picked = batch["boxes"][batch["box_images"][real], batch["box_slots"][real]]
    assert torch.equal(picked, torch.cat([batch["boxes"][i, :n] for i, n in enumerate(counts)]))
    for i, n in enumerate(counts.tolist()):
        assert batch["boxes"][i, n:].abs().sum() == 0
        assert (batch["boxes"][i, :n, 2:] > batch["boxes"][i, :n, :2]).all()
    assert batch["images"].dtype == torch.uint8 and batch["images"].shape == (4, 3, 96, 96)
    assert batch["images"].is_contiguous(memory_format=torch.channels_last)


def test_one_iterator_over_many_epochs_gives_the_per_epoch_batches(tmp_path):
    """What the trainer does (one iterator over the run, so workers start the next epoch
    early) gives the batches of epoch-by-epoch iteration, close_mosaic included, and no batch
    mixes two epochs; a span can start mid-epoch (resume)."""
    dataset = DetectionDataset(
        known_pixels(tmp_path / "img", 10), 96, augment=AugmentConfig(), seed=3,
        close_mosaic_from=2,
    )  # fmt: skip
    per_epoch = batches(build_loader(dataset, 4, workers=2, seed=3), epochs=(0, 1, 2))
    loader = build_loader(dataset, 4, workers=2, seed=3)
    loader.batch_sampler.set_epochs(0, 3)
    assert len(loader) == 3 * loader.batch_sampler.batches_per_epoch == 9
    spanned = list(loader)
    assert same(per_epoch, spanned)
    assert [len(b["image_ids"]) for b in spanned] == [4, 4, 2] * 3  # short last batch each epoch
    loader.batch_sampler.set_epochs(1, 3, start=4)  # resume after epoch 1's first batch
    assert len(loader) == 5 and same(per_epoch[4:], list(loader))


def test_stop_workers_ends_persistent_workers_and_the_loader_still_works(tmp_path):
    """Persistent workers outlive their epoch (that is their point) and, left alone, stop only
    when the iterator is collected or at exit; ``stop_workers`` ends them at once while the
    loader is still referenced, and the loader's next iteration starts new ones."""
    dataset = DetectionDataset(known_pixels(tmp_path / "img", 8), 96, augment=None)
    loader = build_loader(dataset, 4, workers=2, shuffle=False)
    first = list(loader)
    workers = list(loader._iterator._workers)
    assert len(workers) == 2 and all(w.is_alive() for w in workers)  # persistent
    stop_workers(loader)
    assert not any(w.is_alive() for w in workers)
    assert same(first, list(loader))  # new workers, same batches
    stop_workers(loader)
    stop_workers(build_loader(dataset, 4, workers=0))  # no workers: nothing to stop


class NeverPickled(DetectionDataset):
    """A dataset that fails if it is pickled, as a worker started by ``forkserver`` or
    ``spawn`` would receive it."""

    def __getstate__(self):
        raise AssertionError("the dataset was pickled for a worker")


@pytest.fixture
def forkserver_default():
    """The process's default start method set to ``forkserver``: Python 3.14's on Linux."""
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("forkserver", force=True)
    yield
    multiprocessing.set_start_method(before, force=True)


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers fork on Linux only")
def test_workers_fork_on_linux_whatever_the_default_start_method(tmp_path, forkserver_default):
    """Under Python 3.14's default (``forkserver``) a ``DataLoader`` would start each worker
    from the fork server and send it the dataset pickled: the RAM cache copied per worker.
    The loaders' workers are this process's children and receive nothing pickled."""
    assert worker_start_method() == "fork"
    samples = known_pixels(tmp_path / "img", 8)
    dataset = NeverPickled(samples, 96, augment=AugmentConfig(), cache="ram", seed=3)
    loader = build_loader(dataset, 4, workers=2, seed=3)
    forked = batches(loader)
    workers = list(loader._iterator._workers)
    assert [parent_pid(w.pid) for w in workers] == [os.getpid()] * 2
    stop_workers(loader)
    in_process = DetectionDataset(samples, 96, augment=AugmentConfig(), cache="ram", seed=3)
    assert same(forked, batches(build_loader(in_process, 4, workers=0, seed=3)))


class WorkerSeeds(DetectionDataset):
    """Each sample's ``image_id`` is the global torch seed of the process that loaded it."""

    def __getitem__(self, key):
        return {**super().__getitem__(key), "image_id": torch.initial_seed()}


def test_loading_never_draws_from_the_global_torch_generator(tmp_path):
    """A DataLoader without its own generator draws its workers' base seed from the global
    one at every ``iter``; a resumed run makes one such call more than the run it continues,
    so the RNG state it saved at its end differed. The loader's own generator leaves the
    global one alone, and augmentation still differs from epoch to epoch."""
    dataset = DetectionDataset(
        known_pixels(tmp_path / "img", 8), 96, augment=AugmentConfig(), seed=2
    )
    runs = {}
    for workers in (0, 2):
        loader = build_loader(dataset, 4, workers=workers, shuffle=False, seed=2)
        torch.manual_seed(11)
        state = torch.get_rng_state()
        runs[workers] = batches(loader, epochs=(0, 1))
        loader.batch_sampler.set_epochs(0, 2)
        runs[workers] += list(loader)
        assert torch.equal(torch.get_rng_state(), state), f"workers={workers}"
        stop_workers(loader)
    assert same(runs[0], runs[2])
    assert same(runs[0][:4], runs[0][4:])  # one iterator over both epochs: the same batches
    for a, b in zip(runs[0][:2], runs[0][2:4], strict=True):  # epochs 0 and 1, same samples
        assert torch.equal(a["image_ids"], b["image_ids"])
        assert not torch.equal(a["images"], b["images"])


def test_worker_seeds_differ_between_workers_and_follow_the_first_epoch(tmp_path):
    dataset = WorkerSeeds(known_pixels(tmp_path / "img", 8), 96, seed=4)

    def seeds(first: int) -> list[int]:
        loader = build_loader(dataset, 2, workers=2, seed=4)
        loader.batch_sampler.set_epochs(first, first + 1)
        found = [s for b in loader for s in b["image_ids"].tolist()]
        stop_workers(loader)
        return found

    at_0 = seeds(0)
    assert len(set(at_0)) == 2 and max(at_0) - min(at_0) == 1  # base + worker id
    assert seeds(0) == at_0  # a run of this seed starting at epoch 0 gets them again
    assert set(seeds(3)).isdisjoint(at_0)  # a resume at epoch 3 gets seeds of its own


@pytest.mark.parametrize("cache", ["none", "ram"])
def test_an_image_that_stops_decoding_trains_grey_without_its_boxes(tmp_path, caplog, cache):
    """A file deleted, truncated or replaced after the dataset check kills no run: the image
    trains as a grey one of its checked size and its boxes leave the plans, with the draws as
    they were: every sample equals that of a dataset holding a grey, box-less image there."""
    from falconet.data.transforms import PAD_VALUE

    samples = known_pixels(tmp_path / "img")
    lost = samples[3]
    grey = tmp_path / "grey.png"
    Image.fromarray(np.full((lost.height, lost.width, 3), PAD_VALUE, np.uint8)).save(grey)
    no_boxes = np.zeros((0, 4), np.float32), np.zeros(0, np.int64)
    reference = [*samples[:3], Sample(grey, 3, lost.width, lost.height, *no_boxes), *samples[4:]]
    cfg = AugmentConfig(mosaic=1.0)
    if cache == "ram":  # it fails in the cache's fill
        lost.image.write_bytes(b"no longer an image")
    dataset = DetectionDataset(samples, 256, augment=cfg, cache=cache, seed=1)
    expected = DetectionDataset(reference, 256, augment=cfg, cache=cache, seed=1)
    dataset[(0, 0)]  # the plans are made (the file still decodes without a cache)
    lost.image.write_bytes(b"no longer an image")
    with caplog.at_level("WARNING", logger="falconet.data"):
        for epoch in range(2):
            for i in range(len(samples)):
                got, want = dataset[(epoch, i)], expected[(epoch, i)]
                assert torch.equal(got["image"], want["image"]), (epoch, i)
                assert torch.equal(got["boxes"], want["boxes"]), (epoch, i)
                assert torch.equal(got["labels"], want["labels"]), (epoch, i)
    assert caplog.text.count("could not be read") == 1 and str(lost.image) in caplog.text
    # not vacuous: the lost image's boxes were in these samples' plans before it was lost
    planned = DetectionDataset(samples, 256, augment=cfg, seed=1)  # plans read no file
    boxes_in = [
        sum(len(d.plan(e, [i]).labels) for e in range(2) for i in range(len(samples)))
        for d in (planned, expected)
    ]
    assert boxes_in[0] > boxes_in[1]
    letterboxed = DetectionDataset(samples, 256, cache=cache)[3]  # validation: letterbox only
    assert len(letterboxed["boxes"]) == 0 and (letterboxed["image"] == PAD_VALUE).all()
