"""``cache=gpu`` on the CPU: the batched augmentation (:mod:`falconet.data.gpu_augment`) and the
GPU loader run on any torch device, so here they are compared with the CPU loader on the same
images and the same plans: targets equal exactly, pixels within interpolation rounding. The
store's fill decodes with the CPU decoder here (nvJPEG needs a GPU); a file that decodes
nowhere is left out with a warning. The GPU side (nvJPEG, speed) is measured by
tools/bench_data.py on the GPU machine."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from falconet.data.gpu_augment import ImageStore
from falconet.data.gpu_cache import check_fits, fill_store, store_bytes
from falconet.data.gpu_loader import GpuLoader
from falconet.data.loader import DetectionDataset, collate_targets, resized_shape
from falconet.data.records import DataError, Sample
from falconet.data.targets import TARGET_KEYS, Targets
from falconet.data.transforms import AugmentConfig
from falconet_testing.devices import cpu_and_cuda
from falconet_testing.photos import SIZE, photos, ram_store


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FALCONET_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize(("mosaic", "shear"), [(1.0, 0.0), (0.5, 0.0), (0.0, 0.0), (0.5, 8.0)])
def test_gpu_batches_are_the_cpu_render_of_their_plans_up_to_rounding(tmp_path, mosaic, shear):
    samples = photos(tmp_path / "img")
    cfg = AugmentConfig(mosaic=mosaic, degrees=10.0, shear=shear)
    dataset = DetectionDataset(samples, SIZE, augment=cfg, cache="ram", seed=5)
    gpu = GpuLoader(dataset, ram_store(dataset), 4, seed=5)
    gpu.batch_sampler.set_epochs(0, 2)
    differences = []
    batches = 0
    for keys in gpu.batch_sampler:
        batch = gpu.batch(keys)
        plan = dataset.plan(keys[0][0], [index for _, index in keys])
        plans = [plan.sample(b) for b in range(len(plan))]
        items = [
            dataset.item(index, p.boxes, p.labels, mosaic=p.mosaic)
            for (_, index), p in zip(keys, plans, strict=True)
        ]
        expected = collate_targets(items)  # the CPU loader's collate of the same plans
        assert set(batch) == {"images", *expected}
        for key, value in expected.items():
            assert torch.equal(batch[key], value), key  # the plans' boxes: exactly
        images = batch["images"]
        assert images.shape == (len(keys), 3, SIZE, SIZE) and images.dtype == torch.uint8
        assert images.is_contiguous(memory_format=torch.channels_last)
        cpu = torch.from_numpy(np.stack([dataset.render(p) for p in plans])).permute(0, 3, 1, 2)
        differences.append((cpu.int() - images.int()).abs().flatten())
        batches += 1
    assert batches == 2 * 3  # 10 images in batches of 4, two epochs
    diff = torch.cat(differences).float()
    # OpenCV warps in fixed point (1/32 px) and converts HSV through integer tables; the GPU
    # path in float32 and rounds per stage: measured here a mean of 0.25-0.33 levels, 0.35-0.50%
    # of the values more than 2 levels apart, the largest 17-25 at the boxes' sharp edges
    assert diff.mean() < 0.4
    assert (diff > 2).float().mean() < 0.006
    assert torch.quantile(diff[::7], 0.999) <= 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the loader's stream is a CUDA stream")
def test_batches_rendered_on_the_loaders_stream_are_those_rendered_in_line(tmp_path):
    """On a GPU the loader renders one batch ahead on a stream of its own; what the training
    stream reads must be the finished batch, the one rendered in line on the same plans, and
    a batch's memory must not be rendered into again while the training stream, lagging
    behind, has still to read it."""
    samples = photos(tmp_path / "img", count=12)
    dataset = DetectionDataset(samples, SIZE, augment=AugmentConfig(), cache="ram", seed=3)
    store = ram_store(dataset)
    gpu = GpuLoader(dataset, ImageStore(store.pixels.cuda(), store.shapes), 4, seed=3)
    gpu.batch_sampler.set_epochs(0, 2)
    in_line = [gpu.batch(keys)["images"] for keys in gpu.batch_sampler]
    gpu.batch_sampler.set_epochs(0, 2)
    ahead = []
    for batch in gpu:
        # 2 ms of work queued on the training stream before each read: the rendering stream
        # runs ahead, and the later batches' images would land in this one's memory if the
        # allocator could reuse it before the read
        torch.cuda._sleep(2_000_000)
        ahead.append(batch["images"].float().sum((1, 2, 3)))  # read on the training stream
    assert len(ahead) == len(in_line) == 6
    for got, expected in zip(ahead, in_line, strict=True):
        assert torch.equal(got, expected.float().sum((1, 2, 3)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned copies need a CUDA device")
def test_targets_copied_as_the_loop_copies_them_are_their_batches_own(tmp_path):
    """The loader pins each batch's targets in fresh pinned memory, and the loop copies them to
    the device without waiting; with the training stream lagging behind, a pinned block handed
    out again before its copy ran would send a later batch's boxes with this batch's images.
    Each copy must hold the targets planned in line for the same keys."""
    samples = photos(tmp_path / "img", count=12)
    dataset = DetectionDataset(samples, SIZE, augment=AugmentConfig(), cache="ram", seed=3)
    store = ram_store(dataset)
    gpu = GpuLoader(dataset, ImageStore(store.pixels.cuda(), store.shapes), 4, seed=3)
    gpu.batch_sampler.set_epochs(0, 3)
    in_line = [gpu.host_part(keys)[1] for keys in gpu.batch_sampler]
    gpu.batch_sampler.set_epochs(0, 3)
    copied = []
    for batch in gpu:
        torch.cuda._sleep(2_000_000)  # the copies queue behind 2 ms of work, as behind a step
        copied.append(Targets.from_batch(batch).to("cuda", non_blocking=True))
    torch.cuda.synchronize()
    assert len(copied) == len(in_line) == 9
    for got, expected in zip(copied, in_line, strict=True):
        for name in TARGET_KEYS:
            assert torch.equal(getattr(got, name).cpu(), expected[name]), name


def test_the_gpu_loader_resumed_mid_epoch_gives_the_rest_of_the_uninterrupted_epoch(tmp_path):
    """A run resumed at batch 2 of epoch 1 trains the batches the uninterrupted run trained
    from there: the same images, boxes and rendered pixels (each batch's plan is drawn from
    its epoch and samples, not from what came before)."""
    samples = photos(tmp_path / "img", count=9)
    dataset = DetectionDataset(samples, SIZE, augment=AugmentConfig(), cache="ram", seed=1)
    store = ram_store(dataset)
    runs = []
    for start in (0, 4):  # the samples done: 2 batches of 2
        loader = GpuLoader(dataset, store, 2, seed=1)
        loader.batch_sampler.set_epochs(1, 2, start=start)
        runs.append(list(loader))
    whole, resumed = runs
    assert len(whole) == 5 and len(resumed) == 3
    for a, b in zip(whole[2:], resumed, strict=True):
        assert torch.equal(a["image_ids"], b["image_ids"]) and torch.equal(a["boxes"], b["boxes"])
        assert torch.equal(a["images"], b["images"])


@pytest.mark.parametrize("device", cpu_and_cuda("nvJPEG decodes on a CUDA device"))
def test_the_store_fill_decodes_resizes_and_leaves_out_what_cannot_decode(tmp_path, caplog, device):
    samples = photos(tmp_path / "img", count=4)
    broken, empty = tmp_path / "img" / "broken.jpg", tmp_path / "img" / "empty.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    empty.write_bytes(b"")
    no_boxes = np.zeros((0, 4), np.float32), np.zeros(0, np.int64)
    samples += [Sample(broken, 99, 200, 100, *no_boxes), Sample(empty, 98, 200, 100, *no_boxes)]
    with caplog.at_level(logging.WARNING, logger="falconet.data"):
        filled = fill_store(samples, SIZE, torch.device(device), nvjpeg_from=1)
    # the two slots left out hold the first two images again: the store keeps its length
    assert [s.image_id for s in filled.samples] == [0, 1, 2, 3, 0, 1]
    assert filled.left_out == [str(broken), str(empty)]
    assert (filled.on_gpu, filled.on_cpu) == ((4, 0) if device == "cuda" else (0, 4))
    assert "2 image(s) could not be decoded and are left out" in caplog.text
    ram = DetectionDataset(samples[:4], SIZE, cache="ram")
    for i, sample in enumerate(filled.samples):
        h, w = filled.store.shapes[i]
        assert (h, w) == resized_shape(sample, SIZE) == ram._ram[i % 4].shape[:2]
        stored = filled.store.pixels[i, :h, :w].int().cpu()
        # torch's area resampling is not OpenCV's INTER_AREA, by a level or two on average
        assert (stored - torch.from_numpy(ram._ram[i % 4]).int()).abs().float().mean() < 3
        assert not filled.store.pixels[i, h:].any() and not filled.store.pixels[i, :, w:].any()
    assert torch.equal(filled.store.pixels[4], filled.store.pixels[0])


def test_a_store_of_which_nothing_decodes_is_refused_with_what_to_do(tmp_path):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    no_boxes = np.zeros((0, 4), np.float32), np.zeros(0, np.int64)
    with pytest.raises(DataError, match=r"none of the 1 images could be decoded.*data check"):
        fill_store([Sample(broken, 0, 200, 100, *no_boxes)], SIZE, torch.device("cpu"))


def test_an_image_that_cannot_decode_leaves_every_rank_as_many_batches(tmp_path):
    """Under DDP each rank fills its own shard; a file that decodes nowhere must not leave
    one rank with fewer batches an epoch than the others (it would wait in a collective the
    others never reach)."""
    from falconet.training.distributed import World
    from falconet.training.loaders import gpu_shard

    samples = photos(tmp_path / "img", count=14)
    samples[3].image.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")  # rank 1's shard
    lengths, left_out = [], []
    for rank in (0, 1):
        filled = fill_store(gpu_shard(samples, World(rank=rank, size=2)), SIZE, torch.device("cpu"))
        dataset = DetectionDataset(filled.samples, SIZE, augment=AugmentConfig(), seed=rank)
        lengths.append(len(GpuLoader(dataset, filled.store, 2, seed=rank)))
        left_out.append(len(filled.left_out))
    assert left_out == [0, 1] and lengths == [4, 4]


def oriented_photo(path: Path, orientation: int) -> None:
    """A 200 x 120 picture (a bright block in its top-left corner) stored so that a viewer
    applying EXIF ``orientation`` shows it upright: turned by 180 degrees for 3, by 90 for 6
    (the viewer turns it clockwise)."""
    from PIL import Image

    shown = np.full((120, 200, 3), 40, np.uint8)
    shown[:40, :60] = (250, 200, 30)
    stored = {1: shown, 3: np.rot90(shown, 2), 6: np.rot90(shown, 1)}[orientation]
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(np.ascontiguousarray(stored)).save(path, exif=exif.tobytes(), quality=95)


@pytest.mark.parametrize(
    "device", cpu_and_cuda("nvJPEG, which does not apply an EXIF orientation, runs on CUDA")
)
def test_jpegs_stored_turned_are_stored_upright_as_the_dataset_check_measured(tmp_path, device):
    """nvJPEG ignores a JPEG's EXIF orientation: such files go to the CPU decoder, which
    applies it, so the store holds the picture as the check measured it and the labels see
    it (a 90-degree turn swaps its sides; a 180-degree one keeps them, so only the flag set
    by the check can route it)."""
    from falconet.data.check import Candidate, check_split
    from falconet.data.gpu_cache import for_nvjpeg

    folder = tmp_path / "img"
    folder.mkdir()
    candidates = []
    for i, orientation in enumerate((1, 3, 6)):
        oriented_photo(folder / f"{i}.jpg", orientation)
        candidates.append(Candidate(folder / f"{i}.jpg", i))
    samples = check_split("train", candidates, 1, cache_key=str(tmp_path)).samples
    assert [s.exif_oriented for s in samples] == [False, True, True]
    assert [(s.width, s.height) for s in samples] == [(200, 120)] * 3
    assert for_nvjpeg(samples) == [0]
    filled = fill_store(samples, SIZE, torch.device(device), nvjpeg_from=1)
    upright = torch.from_numpy(DetectionDataset(samples[:1], SIZE, cache="ram")._ram[0]).int()
    for i in range(3):
        h, w = filled.store.shapes[i]
        assert (h, w) == tuple(upright.shape[:2])
        stored = filled.store.pixels[i, :h, :w].int().cpu()
        assert (stored - upright).abs().float().mean() < 3  # a turned block: tens of levels


@pytest.mark.parametrize("device", cpu_and_cuda("nvJPEG decodes on a CUDA device"))
def test_grey_cmyk_and_progressive_jpegs_are_stored_as_the_cpu_cache_holds_them(tmp_path, device):
    """JPEG flavours nvJPEG may decode differently or refuse: each lands in the store as the
    CPU loader's cache holds it (nvJPEG's RGB output, or the CPU decoder where it refuses)."""
    from PIL import Image

    from falconet.data.check import Candidate, check_split

    folder = tmp_path / "img"
    folder.mkdir()
    rng = np.random.default_rng(0)
    field = cv2.resize(rng.integers(0, 255, (10, 14, 3)).astype(np.uint8), (220, 150))
    picture = Image.fromarray(field)
    picture.convert("L").save(folder / "grey.jpg", quality=95)
    picture.convert("CMYK").save(folder / "cmyk.jpg", quality=95)
    picture.save(folder / "progressive.jpg", quality=95, progressive=True)
    names = ("grey", "cmyk", "progressive")
    candidates = [Candidate(folder / f"{name}.jpg", i) for i, name in enumerate(names)]
    samples = check_split("train", candidates, 1, cache_key=str(tmp_path)).samples
    filled = fill_store(samples, SIZE, torch.device(device), nvjpeg_from=1)
    assert filled.left_out == [] and filled.on_gpu + filled.on_cpu == 3
    ram = DetectionDataset(samples, SIZE, cache="ram")
    for i in range(3):
        h, w = filled.store.shapes[i]
        assert (h, w) == ram._ram[i].shape[:2]
        stored = filled.store.pixels[i, :h, :w].int().cpu()
        assert (stored - torch.from_numpy(ram._ram[i]).int()).abs().float().mean() < 3, names[i]


def without_torchvision(monkeypatch) -> None:
    """Make torchvision look not installed (``importlib.util.find_spec`` finds no module)."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.split(".")[0] == "torchvision" else find_spec(name, *a),
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="nvJPEG decodes on a CUDA device")
def test_without_torchvision_the_gpu_store_decodes_every_image_on_the_cpu(
    tmp_path, caplog, monkeypatch
):
    samples = photos(tmp_path / "img", count=3)
    without_torchvision(monkeypatch)
    with caplog.at_level(logging.INFO, logger="falconet.data"):
        filled = fill_store(samples, SIZE, torch.device("cuda"), nvjpeg_from=1)
    assert (filled.on_gpu, filled.on_cpu, filled.left_out) == (0, 3, [])
    assert "torchvision is not installed, so every image is decoded on the CPU" in caplog.text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="nvJPEG decodes on a CUDA device")
def test_a_store_of_fewer_jpegs_than_nvjpeg_takes_decodes_them_on_the_cpu(tmp_path, caplog):
    """Below :data:`NVJPEG_FROM` files the CPU threads decode (no wait for torchvision's
    import): an image at its stored size then holds the CPU cache's pixels exactly."""
    from falconet.data.gpu_cache import NVJPEG_FROM

    samples = photos(tmp_path / "img", count=3)
    size = max(samples[0].width, samples[0].height)  # the first image is stored as it is
    assert len(samples) < NVJPEG_FROM
    with caplog.at_level(logging.INFO, logger="falconet.data"):
        filled = fill_store(samples, size, torch.device("cuda"))
    assert (filled.on_gpu, filled.on_cpu, filled.left_out) == (0, 3, [])
    assert "torchvision is not installed" not in caplog.text  # nvJPEG was not wanted
    ram = DetectionDataset(samples, size, cache="ram")._ram
    h, w = filled.store.shapes[0]
    assert (h, w) == (samples[0].height, samples[0].width) == ram[0].shape[:2]
    assert torch.equal(filled.store.pixels[0, :h, :w].cpu(), torch.from_numpy(ram[0]))
    assert fill_store(samples, size, torch.device("cuda"), nvjpeg_from=3).on_gpu == 3


def test_a_store_too_large_for_the_gpu_is_refused_with_the_numbers():
    assert store_bytes(1000, 640) == 1000 * 640 * 640 * 3
    gib = 2**30
    check_fits(1000, 640, free=40 * gib, total=80 * gib, where="cuda:0")  # 1.1 GiB: fine
    need = r"118000 images at imgsz=640 need 135\.0 GiB .*cache=encoded"
    with pytest.raises(DataError, match=need):
        check_fits(118_000, 640, free=120 * gib, total=141 * gib, where="cuda:0")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the store's check is a CUDA device's")
def test_the_store_is_checked_against_the_memory_read_before_the_first_use(tmp_path):
    # the start-up reads the device's memory before the copy of the network takes any, and
    # fills the store beside the copy: the check is against what it read
    samples = photos(tmp_path / "img", count=2)
    gib = 2**30
    with pytest.raises(DataError, match=r"2 images at imgsz=.* of the 0\.0 GiB free"):
        fill_store(samples, SIZE, torch.device("cuda"), memory=(1024, 80 * gib))
    filled = fill_store(samples, SIZE, torch.device("cuda"), memory=(40 * gib, 80 * gib))
    assert filled.on_gpu + filled.on_cpu == 2


FUSED_CHECK = """
import sys
import torch
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_gpu_data import photos, ram_store
from falconet.data import gpu_render
from falconet.data.gpu_augment import render
from falconet.data.gpu_loader import GpuLoader
from falconet.data.loader import DetectionDataset
from falconet.data.transforms import PAD_VALUE, AugmentConfig
size = 64
dataset = DetectionDataset(
    photos(Path({folder!r}), count=6), size, augment=AugmentConfig(mosaic=0.5, degrees=10.0),
    cache="ram", seed=2,
)
store = ram_store(dataset, size)
loader = GpuLoader(dataset, store, 3, seed=2)
diffs = []
for keys in loader.batch_sampler:
    plan, _, _ = loader.host_part(keys)
    fused = gpu_render.render_fused(
        store.pixels, plan.tiles, plan.inverse, plan.tables, size, PAD_VALUE
    )
    assert fused.is_contiguous(memory_format=torch.channels_last)
    diffs.append((render(store, plan, size, fused=False).int() - fused.int()).abs().flatten())
    # the batch split over launches (as above 2**31 output bytes): the same bytes
    limit, gpu_render.LAUNCH_BYTES = gpu_render.LAUNCH_BYTES, size * size * 3 + 1
    split = gpu_render.render_fused(
        store.pixels, plan.tiles, plan.inverse, plan.tables, size, PAD_VALUE
    )
    gpu_render.LAUNCH_BYTES = limit
    assert torch.equal(split, fused)
diff = torch.cat(diffs).float()
print(diff.mean().item(), (diff > 1).float().mean().item(), diff.max().item())
"""


def test_the_fused_kernel_renders_what_the_torch_reference_renders(tmp_path):
    """The Triton kernel in Triton's interpreter (on the CPU, numpy underneath), against the
    torch operations it fuses, on the same plans; the compiled kernel on a GPU is compared
    by tools/bench_data.py --gpu."""
    pytest.importorskip("triton", reason="the fused kernel is written in Triton")
    script = FUSED_CHECK.format(tests=str(Path(__file__).parent), folder=str(tmp_path / "img"))
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # read when the kernel is decorated
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    mean, above_one, largest = map(float, done.stdout.split())
    # float operations ordered differently flip a rounding now and then: measured a mean of
    # 1e-5 to 2e-5 levels and a largest difference of 1 to 5 levels (at 192 px)
    assert mean < 1e-3 and above_one < 1e-4 and largest <= 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel compiles for a CUDA device")
def test_the_kernel_compiled_ahead_renders_what_the_torch_reference_renders(tmp_path, caplog):
    from falconet.data import gpu_render
    from falconet.data.gpu_augment import render
    from falconet.data.transforms import PAD_VALUE

    size, device = 64, torch.device("cuda")
    dataset = DetectionDataset(
        photos(tmp_path / "img", count=6), size, augment=AugmentConfig(mosaic=0.5), seed=2
    )
    filled = fill_store(dataset.samples, size, device)
    with caplog.at_level(logging.DEBUG, logger="falconet.data"):
        gpu_render.compile_in_background(device, size)
        gpu_render._wait_for_compilation()
    assert "did not compile" not in caplog.text  # the warm-up's arguments are the kernel's
    loader = GpuLoader(dataset, filled.store, 3, seed=2)
    plan, _, _ = loader.host_part(next(iter(loader.batch_sampler)))
    plan = plan.to(device)
    fused = gpu_render.render_fused(
        filled.store.pixels, plan.tiles, plan.inverse, plan.tables, size, PAD_VALUE
    )
    diff = (render(filled.store, plan, size, fused=False).int() - fused.int()).abs().float()
    # rounding flips, as in the interpreter's comparison above: measured on the H200, a mean
    # of 1.2e-3 levels here (3 images of 64 px), and 3e-4 with a largest of 8 to 16 levels in
    # tools/bench_data.py --gpu (640 px)
    assert diff.mean() < 5e-3 and diff.max() <= 16


@pytest.mark.parametrize(("count", "world"), [(10, 1), (10, 3), (9, 3), (2, 4)])
def test_ranks_hold_equal_shards_that_together_hold_every_image(tmp_path, count, world):
    from falconet.training.distributed import World
    from falconet.training.loaders import gpu_shard

    samples = photos(tmp_path / "img", count=count)
    shards = [gpu_shard(samples, World(rank=r, size=world)) for r in range(world)]
    assert len({len(shard) for shard in shards}) == 1  # as many batches an epoch on every rank
    assert len(shards[0]) == -(-count // world)
    assert {s.image_id for shard in shards for s in shard} == {s.image_id for s in samples}
    assert gpu_shard(samples, World()) == samples


def test_cache_auto_takes_the_gpu_where_the_images_fit_in_half_its_free_memory(
    tmp_path, monkeypatch, caplog
):
    """The choice itself (the GPU path is tested above and on the GPU machine): ``gpu`` on a
    CUDA device with room for the store, ``none`` without room and without a GPU decoder or
    off CUDA, and any named cache as it is. The free memory is the device's answer, given
    here."""
    from falconet.data.resolve import load_dataset
    from falconet.data.shapes import write_shapes
    from falconet.training.config import TrainConfig
    from falconet.training.loaders import resolve_cache

    data = write_shapes(tmp_path / "shapes", {"train": 24, "val": 4}, size=64)
    dataset = load_dataset(str(data), splits=("train",))
    cfg = TrainConfig(data=str(data), imgsz=64)
    need = len(dataset.splits["train"].samples) * 64 * 64 * 3
    cuda = torch.device("cuda", 0)
    free = {"bytes": 2 * need}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free["bytes"], 10 * need))
    with caplog.at_level("INFO", logger="falconet.train"):
        assert resolve_cache(cfg, dataset, cuda) == "gpu"
    assert "cache=auto: gpu (the decoded images fit in GPU memory; 24 images" in caplog.text
    free["bytes"] = 2 * need - 1  # then a tier that decodes on the GPU (test_gpu_decode.py)
    assert resolve_cache(cfg, dataset, cuda) in ("encoded", "stream", "none")
    without_torchvision(monkeypatch)
    assert resolve_cache(cfg, dataset, cuda) == "none"
    assert resolve_cache(cfg, dataset, torch.device("cpu")) == "none"
    assert resolve_cache(cfg.model_copy(update={"cache": "ram"}), dataset, cuda) == "ram"
