"""Data-loader throughput: augmented training images per second, by workers and cache mode.

On COCO128 (or any data yaml) at 640 px with the training augmentation (mosaic on: four
decodes per image), batch 16, for 1, 2, 4 and 8 workers and cache ``none`` and ``ram``. Each
setting iterates ``--epochs`` epochs; the first is warm-up (worker start, first decodes) and is
left out; the rate is the median over the remaining epochs. It also times single-threaded JPEG
decoding with each library present, the measurement behind the choice of decoder.

With ``--gpu`` (a CUDA device) it measures ``cache=gpu`` beside ``cache=ram`` with
``--gpu-workers`` workers, at each of ``--gpu-batches``: the store's fill by each decoder
(:func:`fill_times`: the CPU threads, nvJPEG's first call and a later one); of the store
nvJPEG filled, the images decoded by nvJPEG and on the CPU, its GiB, and how far its images
are from the CPU cache's (mean absolute difference in levels); and per batch size the
loader's rate, every epoch synchronised with the GPU at its end, and the CPU cores the
process kept busy meanwhile (process CPU time over wall time, loader threads and workers
included); and the render alone, the fused Triton kernel against the torch operations it
fuses (median ms per batch over 20 batches of the same plans, CUDA events, after 3 warm-up
renders; the largest and mean difference between the two in levels); with
``--render-configs``, the fused kernel alone at each launch shape (pixels per program x
warps), and whether its images equal the default shape's.
With ``--tiers`` (a CUDA device) it measures the decoding tiers, ``cache=encoded`` (the
files' bytes in host memory, the fill waited for before timing) and ``cache=stream`` (read per
batch), on the first ``--tier-images`` training images (each once an epoch, no repeats), at
each of ``--gpu-batches``: the loader's img/s and CPU cores as above, the files' GiB and the
fill's seconds, the ring's GiB; how far nvJPEG's pixels are from OpenCV's on the first 256
images (mean absolute difference in levels); and with ``--png-images`` the stream tier over
that many of the images re-saved as PNG (decoded on the CPU reader threads).
``--out`` writes the results as JSON.

    uv run python tools/bench_data.py ../shared/data/coco128/coco128.yaml
    python tools/bench_data.py .data/coco128/coco128.yaml --gpu --gpu-batches 16,64 --out d.json
    python tools/bench_data.py scale/data.yaml --tiers --tier-images 30000 --no-cpu-table
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

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


def busy_cores(pids: list[int]) -> float:
    """CPU seconds so far of this process and ``pids`` (its loader workers)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    total = own.ru_utime + own.ru_stime
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


def thread_seconds() -> dict[str, float]:
    """CPU seconds so far of this process's threads, summed by thread name."""
    seconds: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # a thread that ended meanwhile
            continue
        busy = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        seconds[name] = seconds.get(name, 0.0) + busy
    return seconds


def timed_epochs(loader, epochs: int, device: torch.device | None) -> dict:
    """Median img/s over the epochs after the first, the median CPU cores busy, and for the
    last epoch the cores busy by thread name (where the CPU goes)."""
    rates, cores = [], []
    for epoch in range(epochs):
        loader.batch_sampler.set_epoch(epoch)
        start, count = time.perf_counter(), 0
        iterator = iter(loader)
        pids = [w.pid for w in getattr(iterator, "_workers", [])]
        cpu, threads = busy_cores(pids), thread_seconds()
        for item in iterator:
            count += len(item["images"])
        if device is not None:
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
        if epoch:
            rates.append(count / wall)
            cores.append((busy_cores(pids) - cpu) / wall)
        del iterator
    after = thread_seconds()
    by_thread = {k: round((v - threads.get(k, 0.0)) / wall, 2) for k, v in after.items()}
    return {
        "img_s": round(statistics.median(rates)),
        "cores": round(statistics.median(cores), 2),
        "threads": {k: v for k, v in sorted(by_thread.items(), key=lambda kv: -kv[1]) if v > 0.05},
    }


def render_times(loader, batch: int, count: int = 20) -> dict[str, float]:
    """The render alone, fused kernel against torch reference, on ``count`` batches' plans."""
    from falconet.data.gpu_augment import render

    loader.batch_sampler.set_epochs(0, 1000)  # batches enough at any batch size
    keys = iter(loader.batch_sampler)
    plans = [loader.host_part(next(keys))[0].to(loader.device) for _ in range(count)]
    size = loader.dataset.imgsz
    result: dict[str, float] = {}
    for name, fused in (("fused_ms", True), ("reference_ms", False)):
        for plan in plans[:3]:
            render(loader.store, plan, size, fused=fused)
        times = []
        for plan in plans:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            render(loader.store, plan, size, fused=fused)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        result[name] = round(statistics.median(times), 3)
    diff = torch.cat(
        [
            (
                render(loader.store, p, size, fused=True).int()
                - render(loader.store, p, size, fused=False).int()
            )
            .abs()
            .flatten()
            for p in plans[:4]
        ]
    ).float()
    result["max_diff"] = diff.max().item()
    result["mean_diff"] = round(diff.mean().item(), 6)
    result["fused_img_s"] = round(batch / result["fused_ms"] * 1000)
    return result


def render_config_times(loader, configs: list[tuple[int, int]], count: int = 20) -> dict:
    """The fused kernel alone at each launch shape ``(block, num_warps)``: the median
    milliseconds over ``count`` batches' plans, and whether its images equal the default's."""
    from falconet.data import gpu_render
    from falconet.data.transforms import PAD_VALUE

    loader.batch_sampler.set_epochs(0, 1000)
    keys = iter(loader.batch_sampler)
    plans = [loader.host_part(next(keys))[0].to(loader.device) for _ in range(count)]
    size, pixels = loader.dataset.imgsz, loader.store.pixels

    def run(plan, block, warps):
        return gpu_render.render_fused(
            pixels, plan.tiles, plan.inverse, plan.tables, size, PAD_VALUE,
            block=block, num_warps=warps,
        )  # fmt: skip

    result = {}
    for block, warps in configs:
        for plan in plans[:3]:
            run(plan, block, warps)  # compiled and warm
        times = []
        for plan in plans:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(plan, block, warps)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        same = all(
            torch.equal(run(p, block, warps), run(p, gpu_render.BLOCK, gpu_render.NUM_WARPS))
            for p in plans[:4]
        )
        result[f"{block}x{warps}"] = {"ms": round(statistics.median(times), 4), "same": same}
    return result


def fill_times(samples, size: int, device: torch.device) -> tuple[dict[str, float], Any]:
    """The store's fill by each decoder, synchronized (the choice between them:
    ``falconet.data.gpu_cache.NVJPEG_FROM``): ``torch._dynamo``'s import first, as a run makes
    it ahead; then the CPU threads; then nvJPEG cold (its first call in the process:
    torchvision's import, which reaches the ``torch._dynamo`` imported, and the decoder's
    creation) and warm (the decoder made). Returns the times and the last store filled."""
    from falconet.data.gpu_cache import fill_store

    def timed(action) -> float:
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        action()
        torch.cuda.synchronize(device)
        return round(time.perf_counter() - start, 3)

    times = {"dynamo_import_s": timed(lambda: __import__("torch._dynamo"))}
    filled = []
    for name, nvjpeg_from in (("cpu", len(samples) + 1), ("nvjpeg_cold", 1), ("nvjpeg_warm", 1)):
        fill = lambda n=nvjpeg_from: filled.append(  # noqa: E731
            fill_store(samples, size, device, nvjpeg_from=n)
        )
        times[f"{name}_s"] = timed(fill)
        times[f"{name}_img_s"] = round(len(samples) / times[f"{name}_s"])
    return times, filled[-1]


def gpu_section(args, samples) -> dict:
    """cache=gpu against cache=ram (module docstring)."""
    from falconet.data.gpu_loader import GpuLoader
    from falconet.data.loader import stop_workers

    device = torch.device("cuda")
    unique = list({s.image_id: s for s in samples}.values())
    fills, filled = fill_times(unique, args.imgsz, device)  # filled: nvJPEG's store
    print(f"fill: {fills}", flush=True)
    ram = DetectionDataset(unique, args.imgsz, cache="ram")
    diffs = []
    for i, image in enumerate(ram._ram):
        h, w = image.shape[:2]
        stored = filled.store.pixels[i, :h, :w].cpu().numpy().astype(int)
        diffs.append(float(np.abs(stored - image.astype(int)).mean()))
    result: dict = {
        "images": len(unique),
        "fills": fills,
        "nvjpeg": filled.on_gpu,
        "cpu_decoded": filled.on_cpu,
        "store_gib": round(filled.store.pixels.numel() / 2**30, 3),
        "store_vs_ram_mean_abs_levels": round(statistics.mean(diffs), 3),
        "batches": {},
    }
    repeated = filled.samples * args.repeat
    index = torch.arange(len(filled.samples)).repeat(args.repeat).to(device)
    from falconet.data.gpu_augment import ImageStore

    store = ImageStore(filled.store.pixels[index], filled.store.shapes * args.repeat)
    train = DetectionDataset(repeated, args.imgsz, augment=AugmentConfig())
    cpu_set = DetectionDataset(samples, args.imgsz, augment=AugmentConfig(), cache="ram")
    for batch in (int(b) for b in args.gpu_batches.split(",")):
        gpu = timed_epochs(GpuLoader(train, store, batch), args.epochs, device)
        loader = build_loader(cpu_set, batch, workers=args.gpu_workers, pin_memory=True)
        cpu = timed_epochs(loader, args.epochs, None)
        stop_workers(loader)
        rendered = render_times(GpuLoader(train, store, batch), batch)
        if args.render_configs:
            configs = [tuple(map(int, c.split("x"))) for c in args.render_configs.split(",")]
            rendered["configs"] = render_config_times(GpuLoader(train, store, batch), configs)
        result["batches"][batch] = {
            "gpu": gpu,
            f"ram_{args.gpu_workers}_workers": cpu,
            "render": rendered,
        }
        print(
            f"batch {batch}: cache=gpu {gpu}; cache=ram, {args.gpu_workers} workers {cpu}; "
            f"render {rendered}"
        )
    return result


def tier_section(args, samples) -> dict:
    """``cache=encoded`` and ``cache=stream`` (module docstring)."""
    import tempfile

    from falconet.data.encoded_store import EncodedFiles
    from falconet.data.gpu_decode import DecodedRing, nvjpeg_decoder, ring_pool
    from falconet.data.gpu_loader import GpuLoader
    from falconet.data.records import Sample
    from falconet.data.transforms import read_image

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a dry run
    samples = samples[: args.tier_images]
    paths = [s.image for s in samples]
    result: dict = {"images": len(samples), "batches": {}}
    decode = nvjpeg_decoder(device)
    diffs = [0.0]
    for s in samples[:256] if decode is not None else []:
        data = torch.from_numpy(np.fromfile(s.image, np.uint8))
        gpu = decode([data])[0].permute(1, 2, 0).cpu().numpy().astype(int)
        diffs.append(float(np.abs(gpu - read_image(str(s.image)).astype(int)).mean()))
    result["nvjpeg_vs_opencv_mean_abs_levels"] = round(statistics.mean(diffs), 4)
    held = EncodedFiles(paths, hold=True)
    start = time.perf_counter()
    held.start_filling()
    held.wait_filled()
    result["encoded"] = {
        "gib": round(held.nbytes / 2**30, 3),
        "mean_file_kib": round(held.nbytes / len(held) / 1024, 1),
        "fill_s": round(time.perf_counter() - start, 2),
        "fill_gib_s": round(held.nbytes / 2**30 / (time.perf_counter() - start), 2),
    }
    print(f"tiers: {result}", flush=True)
    kinds = {"encoded": held, "stream": EncodedFiles(paths, hold=False, sizes=held.sizes)}
    png = None
    if args.png_images:
        folder = Path(tempfile.mkdtemp(prefix="bench-png-"))
        png = []
        for i, s in enumerate(samples[: args.png_images]):
            path = folder / f"{i}.png"
            cv2.imwrite(str(path), cv2.cvtColor(read_image(str(s.image)), cv2.COLOR_RGB2BGR))
            png.append(Sample(path, s.image_id, s.width, s.height, s.boxes, s.labels))
        result["png_mean_file_kib"] = round(
            statistics.mean(p.image.stat().st_size for p in png) / 1024, 1
        )
    for batch in (int(b) for b in args.gpu_batches.split(",")):
        row: dict = {}
        for name, files in kinds.items():
            train = DetectionDataset(samples, args.imgsz, augment=AugmentConfig())
            pool = ring_pool(batch, len(samples))
            ring = DecodedRing(samples, files, args.imgsz, device, pool, batch)
            timed_on = device if device.type == "cuda" else None
            row[name] = timed_epochs(GpuLoader(train, ring, batch), args.epochs, timed_on)
            row[name]["ring_gib"] = round(ring.pixels.numel() / 2**30, 3)
            row[name]["refused"] = ring.refused
        if png:
            files = EncodedFiles([p.image for p in png], hold=False)
            train = DetectionDataset(png, args.imgsz, augment=AugmentConfig())
            ring = DecodedRing(png, files, args.imgsz, device, ring_pool(batch, len(png)), batch)
            row["stream_png"] = timed_epochs(GpuLoader(train, ring, batch), args.epochs, timed_on)
        result["batches"][batch] = row
        print(f"batch {batch}: {row}", flush=True)
    return result


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
    parser.add_argument("--gpu", action="store_true", help="also cache=gpu (needs CUDA)")
    parser.add_argument("--gpu-batches", default="16,64")
    parser.add_argument("--gpu-workers", type=int, default=8)
    parser.add_argument(
        "--render-configs",
        default="",
        help="with --gpu: the render kernel alone at each BLOCKxWARPS, e.g. 512x4,1024x8",
    )
    parser.add_argument("--tiers", action="store_true", help="cache=encoded and stream (CUDA)")
    parser.add_argument("--tier-images", type=int, default=20_000)
    parser.add_argument("--png-images", type=int, default=0)
    parser.add_argument("--cpu-table", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out")
    args = parser.parse_args()

    split = load_dataset(args.data, splits=("train",)).splits["train"]
    samples = split.samples * (1 if args.tiers and not args.gpu else args.repeat)
    files = sorted({str(s.image) for s in split.samples})
    print(
        f"data: {args.data}: {len(files)} images x {args.repeat} per epoch, {args.imgsz} px, "
        f"batch {args.batch}, mosaic on, epochs {args.epochs} (first left out)"
    )
    print(
        f"machine: {os.cpu_count()} cores; python {platform.python_version()}; "
        f"torch {torch.__version__}; opencv {cv2.__version__}"
    )
    report: dict = {"torch": torch.__version__, "settings": vars(args)}
    if args.gpu:
        report["device"] = torch.cuda.get_device_name()
        report["gpu"] = gpu_section(args, samples)
        print(json.dumps(report["gpu"]), flush=True)
    if args.tiers:
        report["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        report["tiers"] = tier_section(args, split.samples)
        print(json.dumps(report["tiers"]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    if not args.cpu_table:
        return
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
