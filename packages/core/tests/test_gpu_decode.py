"""``cache=encoded`` and ``cache=stream`` on the CPU: the files' bytes, the ring they are
decoded into per batch and the partner pool, the fallbacks per file, and the tier
``cache=auto`` picks from the numbers. The loader runs on any torch device; here its files
are decoded by the CPU decoder (OpenCV, the CPU cache's), so a ring batch must be the decoded
store's render of the same plan exactly. nvJPEG's own part (speed, its pixels) is measured by
tools/bench_data.py on the GPU machine; its refusals are exercised here through torchvision's
CPU JPEG decoder, which refuses what is not a JPEG as nvJPEG does."""

from __future__ import annotations

import logging

import cv2
import numpy as np
import pytest
import torch

from falconet.data.encoded_store import EncodedFiles, file_sizes
from falconet.data.gpu_augment import PlanTensors, render
from falconet.data.gpu_decode import (
    DECODE_AHEAD,
    DecodedRing,
    auto_cpu_share,
    cpu_share_mask,
    ring_pool,
    ring_slots,
)
from falconet.data.gpu_loader import GpuLoader
from falconet.data.loader import DetectionDataset, collate_targets
from falconet.data.tiers import Footing, choose_tier
from falconet.data.transforms import AugmentConfig
from falconet_testing.photos import SIZE, photos, ram_store

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FALCONET_CACHE_DIR", str(tmp_path / "cache"))


def ring_loader(dataset, batch, pool, *, hold=True, decode_jpegs=None, seed=5, cpu_share=0.0):
    files = EncodedFiles([s.image for s in dataset.samples], hold=hold)
    files.start_filling()
    ring = DecodedRing(
        dataset.samples,
        files,
        SIZE,
        CPU,
        pool,
        batch,
        decode_jpegs=decode_jpegs,
        cpu_share=cpu_share,
    )
    return GpuLoader(dataset, ring, batch, seed=seed)


@pytest.mark.parametrize("hold", [True, False], ids=["encoded", "stream"])
def test_ring_batches_are_the_decoded_stores_render_of_the_same_plans(tmp_path, hold):
    """Every batch from the ring equals, pixel for pixel and box for box, what the decoded
    store renders for the plan drawn with the ring's pool; the pool is the last ``pool``
    images of the epoch's order up to the batch, and only images the ring does not hold are
    decoded."""
    samples = photos(tmp_path / "img", count=13)
    cfg = AugmentConfig(mosaic=1.0, degrees=10.0)
    dataset = DetectionDataset(samples, SIZE, augment=cfg, cache="ram", seed=5)
    store = ram_store(dataset)
    loader = ring_loader(dataset, 3, pool=6, hold=hold)
    sampler = loader.batch_sampler.sampler
    loader.batch_sampler.set_epochs(0, 3)
    decoded = 0
    for keys in loader.batch_sampler:
        epoch, indices = keys[0][0], [i for _, i in keys]
        order = sampler.share(epoch)
        position = order.index(indices[0])
        pool = np.asarray(order[max(0, position + len(keys) - 6) : position + len(keys)])
        host = loader.host_part(keys)
        decoded += len(host[2].jpegs) + len(host[2].decoded)
        got = loader.device_part(*loader.decode_part(host))
        plan = dataset.plan(epoch, indices, pool)
        partners = plan.tiles[:, 1:, 0]
        assert np.isin(partners[partners >= 0], pool).all()
        plans = [plan.sample(b) for b in range(len(plan))]
        items = [
            dataset.item(index, p.boxes, p.labels, mosaic=p.mosaic)
            for index, p in zip(indices, plans, strict=True)
        ]
        for key, value in collate_targets(items).items():
            assert torch.equal(got[key], value), key
        assert torch.equal(got["images"], render(store, PlanTensors.from_plan(plan), SIZE))
    # each image once an epoch plus the partners a new epoch's first batches reuse
    assert 3 * 13 <= decoded < 3 * 13 + 3 * 3 * 3


def test_a_ring_loader_resumed_mid_epoch_gives_the_rest_of_the_uninterrupted_epoch(tmp_path):
    """The resumed run decodes the partners its first batch draws (they were decoded before
    the interruption in the uninterrupted run) and then trains the same batches."""
    samples = photos(tmp_path / "img", count=11)
    dataset = DetectionDataset(samples, SIZE, augment=AugmentConfig(mosaic=1.0), seed=1)
    runs = []
    for start in (0, 6):  # 3 batches of 2 done
        loader = ring_loader(dataset, 2, pool=8, seed=1)
        loader.batch_sampler.set_epochs(1, 2, start=start)
        runs.append(list(loader))
    whole, resumed = runs
    assert len(whole) == 6 and len(resumed) == 3
    for a, b in zip(whole[3:], resumed, strict=True):
        assert torch.equal(a["image_ids"], b["image_ids"]) and torch.equal(a["boxes"], b["boxes"])
        assert torch.equal(a["images"], b["images"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the decoding stream is a CUDA stream")
@pytest.mark.parametrize("cpu_share", [0.0, 0.5], ids=["nvjpeg", "half-on-cpu"])
def test_batches_decoded_ahead_on_their_own_thread_and_stream_are_those_decoded_in_line(
    tmp_path, monkeypatch, cpu_share
):
    """On a GPU the ring loader decodes up to ``DECODE_AHEAD`` batches ahead on a thread and a
    stream of its own. Each render is slowed on the device (its stream sleeps first) and the
    training stream lags behind every batch: a decode that wrote a slot before the render that
    reads it was done, or a render that read a slot before its decode ended, would change
    the pixels. The pool is a single batch, so every slot is written again two batches on.
    Compared with a second ring loader over the same files and seed, every part on one
    thread and one stream. With half the files decoded on the CPU, their copies up from
    pinned memory are asynchronous too."""
    from falconet.data import gpu_loader

    samples = photos(tmp_path / "img", count=24)
    dataset = DetectionDataset(samples, SIZE, augment=AugmentConfig(mosaic=1.0), seed=4)
    cuda = torch.device("cuda")

    def loader():
        files = EncodedFiles([s.image for s in samples], hold=True)
        files.start_filling()
        ring = DecodedRing(samples, files, SIZE, cuda, 4, 4, cpu_share=cpu_share)
        return GpuLoader(dataset, ring, 4, seed=4)

    in_line, ahead = loader(), loader()
    in_line.batch_sampler.set_epochs(0, 3)
    expected = [in_line.batch(keys)["images"].clone() for keys in in_line.batch_sampler]
    slow = gpu_loader.render

    def slow_render(*args, **kwargs):
        torch.cuda._sleep(3_000_000)  # on the rendering stream, before it reads the ring
        return slow(*args, **kwargs)

    monkeypatch.setattr(gpu_loader, "render", slow_render)
    ahead.batch_sampler.set_epochs(0, 3)
    got = []
    for batch in ahead:
        torch.cuda._sleep(2_000_000)  # the training stream behind the loader
        got.append(batch["images"].clone())
    assert len(got) == len(expected) == 18
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def cpu_jpeg_decoder(data: list[torch.Tensor]) -> list[torch.Tensor]:
    """torchvision's JPEG decoder on the CPU in nvJPEG's place: the same call, the same
    refusal (``RuntimeError``) of bytes that are not a JPEG it reads."""
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(data, mode=ImageReadMode.RGB)


def test_files_the_gpu_decoder_refuses_go_to_the_cpu_and_lost_files_train_grey(tmp_path, caplog):
    """A PNG named ``.jpg`` (the dataset check passes it: Pillow reads it) is refused by the
    JPEG decoder: decoded on the CPU instead, counted, one warning. A file that no longer
    decodes at all (overwritten after the check) trains as a grey image, its boxes left out
    from the next plan on, one warning, as the CPU loader does. Neither ends the epoch."""
    pytest.importorskip("torchvision")
    samples = photos(tmp_path / "img", count=8)
    png = cv2.imread(str(samples[2].image))
    assert cv2.imwrite(str(tmp_path / "img" / "2.png"), png)
    samples[2].image.write_bytes((tmp_path / "img" / "2.png").read_bytes())  # PNG named .jpg
    samples[5].image.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg any more")
    cfg = AugmentConfig(mosaic=0.0, translate=0.0, scale=0.0, hsv_h=0, hsv_s=0, hsv_v=0, fliplr=0)
    dataset = DetectionDataset(samples, SIZE, augment=cfg, seed=2)
    loader = ring_loader(dataset, 4, pool=8, hold=False, decode_jpegs=cpu_jpeg_decoder)
    loader.batch_sampler.set_epochs(0, 4)
    with caplog.at_level(logging.INFO, logger="falconet.data"):
        batches = list(loader)
    assert len(batches) == 8
    assert loader.ring.refused == 2 and loader.ring.on_cpu[[2, 5]].all()
    assert not loader.ring.on_cpu[[0, 1, 3, 4, 6, 7]].any()
    assert caplog.text.count("nvJPEG refused it") == 1
    assert caplog.text.count("could not be read") == 1 and "5.jpg" in caplog.text
    by_id = {}  # the last epoch's: the plans made before the loss was found keep their boxes
    for batch in batches[6:]:
        for b, image_id in enumerate(batch["image_ids"].tolist()):
            by_id[image_id] = (batch["images"][b], int(batch["counts"][b]))
    lost, lost_boxes = by_id[5]
    h, w = dataset.shape(5)
    top, left = (SIZE - h) // 2, (SIZE - w) // 2
    assert (lost[:, top : top + h, left : left + w] == 114).all() and lost_boxes == 0
    png_image, png_boxes = by_id[2]
    assert png_boxes == len(samples[2].labels) and png_image.float().std() > 10


def test_a_cpu_share_decodes_its_fixed_images_on_the_cpu_and_changes_no_plan(tmp_path):
    """``cpu_share=0.5`` sends a fixed half of the JPEG files (the same in every epoch and in
    every ring over the set) to the CPU decoder and the rest to the JPEG decoder (here
    torchvision's on the CPU, in nvJPEG's place): every plan and target is the same as with
    no share, and the pixels differ only by the two decoders' and resizes' rounding."""
    pytest.importorskip("torchvision")
    samples = photos(tmp_path / "img", count=16)
    dataset = DetectionDataset(samples, SIZE, augment=AugmentConfig(mosaic=1.0), seed=3)
    runs = {}
    for share in (0.0, 0.5):
        loader = ring_loader(dataset, 4, pool=8, decode_jpegs=cpu_jpeg_decoder, cpu_share=share)
        expected = cpu_share_mask(16, share)
        assert (loader.ring.on_cpu == expected).all()
        loader.batch_sampler.set_epochs(0, 2)
        batches = []
        for keys in loader.batch_sampler:
            host = loader.host_part(keys)
            assert all(expected[i] for i, _, _ in host[2].decoded)
            assert not any(expected[i] for i, _ in host[2].jpegs)
            batches.append(loader.device_part(*loader.decode_part(host)))
        runs[share] = batches
    assert 4 <= cpu_share_mask(16, 0.5).sum() <= 12
    assert not (cpu_share_mask(1000, 0.25) & ~cpu_share_mask(1000, 0.5)).any()  # nested
    for a, b in zip(runs[0.0], runs[0.5], strict=True):
        for key in ("boxes", "labels", "counts", "image_ids", "mosaic"):
            assert torch.equal(a[key], b[key]), key
        assert (a["images"].float() - b["images"].float()).abs().mean() < 1.5


def test_cpu_decode_auto_takes_none_up_to_four_cores_and_at_most_three_quarters():
    shares = [auto_cpu_share(c) for c in (1, 2, 4, 8, 12, 16, 64)]
    assert shares == [0.0, 0.0, 0.0, 0.25, 0.5, 0.75, 0.75]
    with pytest.raises(ValueError, match="from 0 to 1"):
        DecodedRing([], EncodedFiles([], hold=False), SIZE, CPU, 1, 1, cpu_share=2.0)


def test_encoded_files_hold_the_files_bytes_and_read_through_before_the_fill(tmp_path):
    samples = photos(tmp_path / "img", count=6)
    paths = [s.image for s in samples]
    files = EncodedFiles(paths, hold=True)
    assert files.nbytes == sum(p.stat().st_size for p in paths)
    assert not files.held.any()
    assert files.read(3).tobytes() == paths[3].read_bytes()  # from disk, before the fill
    files.start_filling(threads=2)
    assert files.wait_filled(timeout=30) and files.held.all() and files.fill_seconds is not None
    for i, path in enumerate(paths):
        assert files.read(i).tobytes() == path.read_bytes()
    paths[1].write_bytes(paths[1].read_bytes() + b"grown")  # changed after the fill
    again = EncodedFiles(paths, hold=True, sizes=files.sizes)
    again.start_filling(threads=1)
    again.wait_filled(timeout=30)
    assert not again.held[1] and again.read(1).tobytes() == paths[1].read_bytes()
    (tmp_path / "gone.jpg").write_bytes(b"x")
    sizes = file_sizes([tmp_path / "gone.jpg", tmp_path / "never.jpg"])
    assert sizes.tolist() == [1, -1]
    streamed = EncodedFiles(paths, hold=False)
    streamed.start_filling()
    assert streamed.buffer.size == 0 and streamed.read(0).tobytes() == paths[0].read_bytes()


GIB = 2**30


@pytest.mark.parametrize(
    ("decoded", "encoded", "gpu_free", "host", "decoder", "tier"),
    [
        (4 * GIB, None, 10 * GIB, 64 * GIB, True, "gpu"),
        (4 * GIB, None, 10 * GIB, 64 * GIB, False, "gpu"),
        (135 * GIB, 19 * GIB, 70 * GIB, 120 * GIB, True, "encoded"),
        (135 * GIB, 19 * GIB, 70 * GIB, 30 * GIB, True, "stream"),
        (135 * GIB, 19 * GIB, 70 * GIB, 120 * GIB, False, "none"),
        (135 * GIB, 19 * GIB, 2 * GIB, 120 * GIB, True, "none"),  # not even the ring
    ],
)
def test_cache_auto_takes_the_first_tier_that_fits(decoded, encoded, gpu_free, host, decoder, tier):
    footing = Footing(
        images=118_287,
        decoded_bytes=decoded,
        encoded_bytes=encoded,
        ring_bytes=int(1.2 * GIB),
        gpu_free=gpu_free,
        host_available=host,
        gpu_decoder=decoder,
    )
    chosen, why = choose_tier(footing)
    assert chosen == tier and why
    if tier == "none" and not decoder:
        assert "pip install torchvision" in why
    assert "118287 images" in footing.describe()


def test_the_pool_holds_four_batches_at_least_and_no_more_than_the_images():
    assert ring_pool(16, 118_287) == 1024
    assert ring_pool(512, 118_287) == 2048
    assert ring_pool(16, 300) == 300
    assert ring_pool(64, 40) == 64  # a batch is always decoded whole
    # and the ring, the batches decoded ahead beside the pool
    assert ring_slots(16, 118_287) == 1024 + DECODE_AHEAD * 16


def test_cache_auto_logs_its_numbers_and_takes_encoded_then_stream(tmp_path, monkeypatch, caplog):
    """``resolve_cache`` counts the files only where the decoded store does not fit, and picks
    by the device's free memory and the host's available memory (both given here)."""
    pytest.importorskip("torchvision")
    from falconet.data import tiers
    from falconet.data.resolve import load_dataset
    from falconet.data.shapes import write_shapes
    from falconet.training import loaders
    from falconet.training.config import TrainConfig

    data = write_shapes(tmp_path / "shapes", {"train": 24, "val": 4}, size=64)
    dataset = load_dataset(str(data), splits=("train",))
    cfg = TrainConfig(data=str(data), imgsz=64, batch=4)
    files = sum(s.image.stat().st_size for s in dataset.splits["train"].samples)
    need = 24 * 64 * 64 * 3
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (need, 10 * need))
    host = {"bytes": 4 * files}
    monkeypatch.setattr(loaders, "host_available", lambda: host["bytes"])
    monkeypatch.setattr(loaders, "ring_slots", lambda batch, count: 4)  # of the 24 images
    cuda = torch.device("cuda", 0)
    with caplog.at_level("INFO", logger="falconet.train"):
        assert loaders.resolve_cache(cfg, dataset, cuda) == "encoded"
    assert f"files {files / GIB:.2f} GiB" in caplog.text and "24 images" in caplog.text
    host["bytes"] = int(files / tiers.HOST_SHARE) - 1
    assert loaders.resolve_cache(cfg, dataset, cuda) == "stream"


@pytest.mark.parametrize(
    ("cpu_decode", "local_ranks", "share"),
    [("auto", "1", 0.75), ("auto", "2", 0.25), ("auto", "4", 0.0), (0.4, "4", 0.4)],
)
def test_cpu_decode_auto_counts_this_ranks_share_of_the_cores(
    tmp_path, monkeypatch, cpu_decode, local_ranks, share
):
    """``auto`` reads the cores per rank (16 usable, shared by torchrun's local ranks); a
    number is taken as given."""
    from falconet.training import loaders
    from falconet.training.config import TrainConfig

    samples = photos(tmp_path / "img", count=4)
    monkeypatch.setattr(loaders, "usable_cores", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_ranks)
    cfg = TrainConfig(imgsz=SIZE, batch=2, cache="encoded", cpu_decode=cpu_decode)
    files = EncodedFiles([s.image for s in samples], hold=False)
    ring = loaders.ring(cfg, loaders.Encoded(samples, files), CPU, 2)
    assert ring.cpu_share == share
