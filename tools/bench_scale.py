"""A run at a dataset's own scale: end-to-end img/s over a span of steps against the isolated
step, by where the images live (``cache=``), with the start-up and what the store takes.

    python tools/bench_scale.py --data scale/data.yaml --caches encoded,stream --batch 16,64 \\
        --span 200,1500 --out scale.json [--ultralytics-images 20000]

Made for sets too large for ``tools/bench_train.py``'s repeated COCO128 (its end to end is whole
epochs): a set of ``tools/make_scale_set.py`` with 100k images or more, where an epoch takes
minutes. Every measurement runs in a fresh process (``--worker``). Per cache and batch:

* **end to end** (falconet's own loop: loader, step, EMA; validation and checkpoints off):
  images/s from the end of step ``W`` to the end of step ``W + T`` (``--span W,T``; the device
  synchronised at both ends only), the CPU cores the process and its threads kept busy over the
  same steps (by thread name), the GPU's busy share over them (NVML's utilisation, sampled every
  0.1 s), the seconds from the process's start to the end of its first batch (synchronised) and
  to the trainer's construction, what the images take on the GPU (the decoded store or the
  decoding ring) and in host memory (``cache=encoded``'s files), and the fill's seconds
  (``cache=encoded``: the readers' fill beside training, ``None`` where it had not ended);
* **isolated step**: ``tools/bench_train.py``'s (one batch of the set, 20 warm-up steps,
  median of 100, CUDA events), with ``cache=stream`` (no store to fill beside it);
* with ``--ultralytics-images K``: Ultralytics (``bench-peers.txt``'s) end to end over its
  second epoch of the set's first ``K`` images (its own loader, ``cache=False``: a RAM cache of
  the set would not fit, as ours does not), at the same batch, size and fp16.

With ``--trace N --trace-to 'trace-{cache}-{batch}.json.gz'``, each falconet arm also traces ``N``
steps after its span (torch.profiler: every GPU stream, and the loop thread's operators; the
span itself is timed untraced), for a timeline of where the GPU waits.

A ``--caches`` entry may carry keys of its own after its cache (``encoded:cpu_decode=0``).

Every arm trains yolo-n at ``--imgsz`` with ``amp_dtype=--amp`` and ``graph=--graph``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_train import MARK


def process_age() -> float:
    """Seconds since this process started (Linux: its start time against the uptime)."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/self/stat") as f:
        started = int(f.read().rsplit(")", 1)[1].split()[19]) / ticks
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) - started


class GpuBusy:
    """NVML's utilisation of the device (the share of time a kernel ran), sampled on a thread."""

    def __init__(self, every: float = 0.1) -> None:
        self.every, self.samples = every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import torch

        while not self._stop.wait(self.every):
            try:
                self.samples.append(torch.cuda.utilization())
            except Exception:  # no NVML here: reported as None
                return

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join()
        return round(statistics.mean(self.samples) / 100, 3) if self.samples else None


class Span:
    """falconet's side: the span's two ends, the first batch, and a stop after the span (or,
    with ``trace`` steps and a ``trace_to`` path, after a torch.profiler trace of that many
    steps more: the GPU's streams, and the loop thread's operators, as a Chrome trace)."""

    def __init__(self, warm: int, steps: int, trace: int = 0, trace_to: str = "") -> None:
        self.warm, self.steps, self.done = warm, steps, 0
        self.trace, self.trace_to, self.profiler = trace, trace_to, None
        self.result: dict = {}
        self.busy = GpuBusy()

    def on_step_end(self, trainer) -> None:
        import torch
        from bench_data import thread_seconds
        from bench_train import tree_cpu_seconds

        self.done += 1
        synchronize = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
        if self.done == 1:
            synchronize()
            self.result["first_batch_from_process_start_s"] = round(process_age(), 2)
        if self.done in (self.warm, self.warm + self.steps):
            synchronize()
            ends = self.result.setdefault("ends", [])
            ends.append((time.perf_counter(), tree_cpu_seconds(), thread_seconds()))
            if self.done == self.warm:
                self.busy.start()
            else:
                self.result["gpu_busy"] = self.busy.stop()
                if not self.trace:
                    trainer.request_stop("bench_scale: the span is measured")
                else:
                    self.profiler = torch.profiler.profile()
                    self.profiler.start()
        if self.profiler is not None and self.done == self.warm + self.steps + self.trace:
            synchronize()
            self.profiler.stop()
            self.profiler.export_chrome_trace(self.trace_to)
            trainer.request_stop("bench_scale: the span is measured and traced")


def run_falconet(args) -> dict:
    import torch

    from falconet.plugins import get_plugins
    from falconet.training.planning import plan_run
    from falconet.training.trainer import Trainer

    plugins = get_plugins()
    keys = dict(
        data=str(args.data),
        epochs=1,
        batch=args.batch,
        imgsz=args.imgsz,
        cache=args.cache.split(":")[0],
        amp_dtype=args.amp,
        graph=args.graph,
        val=False,
        plots=False,
        close_mosaic=0,
        deterministic=False,
        project=args.tmp,
        name=f"scale-{args.cache.split(':')[0]}-{args.batch}",
    )
    keys.update(arm_keys(args.cache))
    span = Span(*args.span, args.trace, args.trace_to)
    trainer = Trainer(plan_run(keys, plugins), plugins, [span])
    built = round(process_age(), 2)
    loader = trainer.run.train_loader
    trainer.fit()
    result = span.result
    (t0, cpu0, threads0), (t1, cpu1, threads1) = result.pop("ends")
    wall = t1 - t0
    result.update(
        graph=trainer.run.graph,
        images=len(loader.dataset),
        trainer_built_from_process_start_s=built,
        img_s=round(args.span[1] * args.batch / wall, 1),
        cpu_cores=round((cpu1 - cpu0) / wall, 2),
        cpu_cores_by_thread={
            k: round((v - threads0.get(k, 0.0)) / wall, 2)
            for k, v in sorted(threads1.items(), key=lambda kv: -kv[1])
            if (v - threads0.get(k, 0.0)) / wall > 0.05
        },
        peak_allocated_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if torch.cuda.is_available()
        else None,
        loss=trainer.state.logged,
    )
    ring = getattr(loader, "ring", None)
    store = ring.pixels if ring is not None else getattr(loader, "store", None)
    store = getattr(store, "pixels", store)
    result["images_on_gpu_gib"] = round(store.numel() / 2**30, 3) if store is not None else 0
    if ring is not None:
        files = ring.files
        result.update(
            files_in_host_memory_gib=round(files.nbytes / 2**30, 2) if files.hold else 0.0,
            fill_s=files.fill_seconds,
            held_at_end=round(float(files.held.mean()), 3) if files.hold else 0.0,
            refused=ring.refused,
        )
    return result


def arm_keys(cache: str) -> dict[str, str]:
    """The keys a ``--caches`` entry adds after its cache: ``encoded:cpu_decode=0`` trains
    with ``cache=encoded cpu_decode=0``."""
    return dict(item.split("=", 1) for item in cache.split(":")[1:])


def run_step(args) -> dict:
    """The isolated step, by bench_train's measure (module docstring)."""
    import bench_train

    step_args = argparse.Namespace(
        data_yaml=args.data,
        epochs=1,
        batch=args.batch,
        imgsz=args.imgsz,
        workers=8,
        amp=args.amp,
        arm_keys={"cache": "stream", "graph": args.graph},
        measure="step",
        warmup=20,
        steps=100,
        gpu_profile=True,
        kernel_rows=5,
        bucket=None,
        tmp=args.tmp,
    )
    result = bench_train.run_falconet(step_args)
    result.pop("kernels", None)
    result["img_s"] = round(args.batch * 1000 / result["step_ms"], 1)
    return result


def subset_yaml(data: Path, images: int, folder: Path) -> Path:
    """A yaml of the set's first ``images`` training images (a list file) and its val."""
    from falconet.data.yolo import dataset_root, image_files, read_yaml

    config = read_yaml(data)
    root = dataset_root(config, data)
    train = image_files(config["train"], root, "train")[:images]
    listing = folder / "subset.txt"
    listing.write_text("".join(f"{p.resolve()}\n" for p in train))
    val = image_files(config["val"], root, "val")
    (folder / "val.txt").write_text("".join(f"{p.resolve()}\n" for p in val))
    import yaml

    out = folder / "subset.yaml"
    keys = {"path": str(folder), "train": str(listing), "val": "val.txt", "names": config["names"]}
    out.write_text(yaml.safe_dump(keys))
    return out


def run_ultralytics(args) -> dict:
    import bench_train

    bench_train._offline_ultralytics(Path(args.tmp))
    from ultralytics.engine.trainer import BaseTrainer
    from ultralytics.models.yolo.detect import DetectionTrainer

    BaseTrainer.read_results_csv = lambda self: {}  # as bench_train.py does
    data = subset_yaml(args.data, args.ultralytics_images, Path(tempfile.mkdtemp()))
    clock = bench_train.EpochClock({1, 2})
    overrides = bench_train.ultralytics_overrides(
        data, 2, args.batch, args.imgsz, 8, False, args.tmp
    )
    trainer = DetectionTrainer(overrides=overrides)
    trainer.add_callback("on_train_start", lambda t: clock.tick())
    trainer.add_callback("on_train_epoch_end", lambda t: clock.tick())
    trainer.train()
    clock.drop_first()
    images = len(trainer.train_loader.dataset)
    return {
        "images": images,
        "img_s": round(clock.throughput(images), 1),
        "cpu_cores": round(clock.cores(), 2),
        "span": "its second epoch",
    }


ARMS = {"falconet": run_falconet, "step": run_step, "ultralytics": run_ultralytics}


def worker(args) -> None:
    result = {"arm": args.worker, "cache": args.cache, "batch": args.batch}
    try:
        result.update(ARMS[args.worker](args))
    except Exception as exc:  # one failed measurement must not lose the others
        result["error"] = f"{type(exc).__name__}: {exc}"
    print(MARK + json.dumps(result, default=str), flush=True)


def spawn(args, arm: str, cache: str, batch: int) -> dict:
    command = [
        sys.executable,
        __file__,
        "--worker",
        arm,
        "--data",
        str(args.data),
        "--caches",
        cache,
        "--batch",
        str(batch),
        "--span",
        ",".join(map(str, args.span)),
        "--imgsz",
        str(args.imgsz),
        "--amp",
        args.amp,
        "--graph",
        args.graph,
        "--ultralytics-images",
        str(args.ultralytics_images),
        "--tmp",
        args.tmp,
        "--trace",
        str(args.trace),
        "--trace-to",
        args.trace_to.replace("{cache}", cache.replace(":", "-").replace("=", ""))
        .replace("{batch}", str(batch)),
    ]
    from bench_train import marked_result

    return marked_result(command, args.timeout, arm=arm, cache=cache, batch=batch)


def table(results: list[dict]) -> str:
    steps = {r["batch"]: r["img_s"] for r in results if r["arm"] == "step" and "img_s" in r}
    lines = [
        "| arm | cache | batch | img/s | of the step | GPU busy | CPU cores | first batch s |"
        " on GPU GiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['arm']} | {r['cache']} | {r['batch']} | error: {r['error']} |")
            continue
        share = f"{r['img_s'] / steps[r['batch']]:.1%}" if r["batch"] in steps else ""
        lines.append(
            f"| {r['arm']} | {r.get('cache', '')} | {r['batch']} | {r['img_s']} | {share} | "
            f"{r.get('gpu_busy', r.get('gpu_busy_fraction', ''))} | {r.get('cpu_cores', '')} | "
            f"{r.get('first_batch_from_process_start_s', '')} | "
            f"{r.get('images_on_gpu_gib', '')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--caches", default="encoded")
    parser.add_argument("--batch", default="16,64")
    parser.add_argument("--span", default="200,1500", help="W,T: steps to skip, steps to time")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--amp", default="fp16")
    parser.add_argument("--graph", default="whole-step")
    parser.add_argument("--ultralytics-images", type=int, default=0)
    parser.add_argument("--no-step", action="store_true", help="leave the isolated step out")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--trace", type=int, default=0, help="steps traced after the span")
    parser.add_argument("--trace-to", default="", help="its Chrome trace (.json.gz)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.span = tuple(int(v) for v in args.span.split(","))
    if args.worker:
        args.cache, args.batch = args.caches, int(args.batch)
        worker(args)
        return
    args.tmp = args.tmp or tempfile.mkdtemp(prefix="bench-scale-")
    results: list[dict] = []
    for batch in (int(b) for b in args.batch.split(",")):
        planned = [] if args.no_step else [("step", "stream")]
        planned += [("falconet", cache) for cache in args.caches.split(",") if cache]
        if args.ultralytics_images:
            planned.append(("ultralytics", "files"))
        for arm, cache in planned:
            results.append(spawn(args, arm, cache, batch))
            print(json.dumps(results[-1], default=str), flush=True)
            if args.out:
                payload = {"settings": vars(args), "results": results, "table": table(results)}
                args.out.write_text(json.dumps(payload, indent=1, default=str))
    print(table(results))


if __name__ == "__main__":
    main()
