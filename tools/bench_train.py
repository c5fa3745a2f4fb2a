"""Training speed side by side: falconet against Ultralytics, LibreYOLO, RF-DETR; same data, GPU.

    python tools/bench_train.py --data .data/coco128 --arms falconet,ultralytics,libreyolo \\
        --batch 16,64 --repeats 3 --epochs 4 --repeat-data 4 --out bench.json

Every measurement runs in a fresh process (``--worker``), arms alternate within each repeat.
With ``--gpus 0,1`` the measurements run two at a time, each alone on its GPU (the next one
starts on whichever GPU is free); ``--out`` is rewritten after every measurement, so a run
cut short keeps what it measured, and ``--table-from`` prints the tables of saved runs.
Per arm and batch size:

* **end to end**: images/s over epochs 2..N, from the wall time between consecutive epoch ends
  (each framework's own loop: loader, step, EMA, checkpoint; validation off), on COCO128
  repeated ``--repeat-data`` times (symlinks) so an epoch is long enough to be stable, and the
  CPU cores busy over the same epochs (``cpu_cores``: the process's threads and its loader
  workers, from /proc); for a falconet graph backend also its captures and their host time
  over the run (``capture_s``), and the backend's log lines (``graph_log``: each capture's
  bucket, host time and its warm-up and capture phases); for falconet the garbage collections
  during ``fit`` (``collections``: per generation, and each of 1 ms or more with its start);
* **isolated step** (falconet, Ultralytics, RF-DETR): forward + loss + backward + optimizer +
  EMA on one fixed batch, 20 warm-up steps, median of 100, CUDA events;
* **falconet only**: GPU-busy fraction (kernel time over step wall time, torch.profiler over
  20 steps), the step's busy, kernel and overlap milliseconds (:func:`gpu_time`; the same for
  a batch of ``--trace-last-epoch``'s traced epoch), kernels per step and host syncs per step
  (``set_sync_debug_mode("warn")``);
* **accuracy**, once per arm: the losses of the last timed epoch (each framework's own terms)
  and the mAP after an overfit of COCO128 (train = val, ``--overfit-epochs`` at
  ``--overfit-batch``), scored by the framework's own evaluator.

An arm may carry falconet keys after colons (``falconet:optimizer=adamw:lr0=0.000119``: the
recipe closest to a peer's); an ``rfdetr`` arm carries its own configs' fields
(``rfdetr:imgsz=384:cuda_graphs=true``, :func:`run_rfdetr`).

Settings shared by every arm: 640 px, fp16 autocast (each framework's AMP), cache in RAM,
``--workers`` loader workers, mosaic throughout, from scratch, nothing downloaded. The peers
run offline as docs/benchmarks.md describes (environment set here). RF-DETR
(``rfdetr:imgsz=384``) differs where its trainer does (:func:`run_rfdetr`): bf16 autocast, its
own augmentation (no mosaic), no cache. Prints a markdown table of medians with the ratio to
Ultralytics and writes every raw result to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MARK = "BENCH "


# ------------------------------------------------------------------------------- data
def repeated_dataset(source: Path, times: int, folder: Path) -> Path:
    """COCO128 (YOLO labels) repeated ``times`` by symlinks; val is the original 128."""
    source = source.resolve()
    config = (source / "coco128.yaml").read_text()
    names = config[config.index("names:") :].split("\n#")[0]
    for split, repeat in (("train", times), ("val", 1)):
        (folder / "images" / split).mkdir(parents=True, exist_ok=True)
        (folder / "labels" / split).mkdir(parents=True, exist_ok=True)
        for image in sorted((source / "images" / "train2017").iterdir()):
            label = source / "labels" / "train2017" / f"{image.stem}.txt"
            for k in range(repeat):
                stem = f"r{k}_{image.stem}"
                (folder / "images" / split / f"{stem}{image.suffix}").symlink_to(image)
                if label.exists():
                    (folder / "labels" / split / f"{stem}.txt").symlink_to(label)
    yaml_path = folder / "data.yaml"
    yaml_path.write_text(f"path: {folder}\ntrain: images/train\nval: images/val\n{names}\n")
    # the accuracy check: COCO128 once, train = val (an overfit, as in docs/performance.md)
    (folder / "overfit.yaml").write_text(
        f"path: {folder}\ntrain: images/val\nval: images/val\n{names}\n"
    )
    return yaml_path


# ------------------------------------------------------------------------ measurements
class EpochClock:
    """Wall-clock time of every epoch end (the same callback idea in every framework), the
    run's start counted as end 0. The CPU time of the process, its threads and its loader
    workers is read only at the ends in ``reads_at`` (every end when ``None``): reading /proc
    for each of a run's threads takes milliseconds, which at every end would be the
    benchmark's own time in the next epoch (docs/lab/2026-12-cache-gpu-history.md, 2026-12-04)."""

    def __init__(self, reads_at: set[int] | None = None) -> None:
        self.ends: list[float] = []
        self.reads_at = reads_at
        self.cpu: dict[int, float] = {}  # CPU seconds of the process and its loader workers
        self.threads: dict[int, dict[str, float]] = {}  # the process's, by thread name
        self.first, self.dropped = 0, 0  # the span measured: ends[first] to ends[-1 - dropped]

    def tick(self, *_args, **_kwargs) -> None:
        import torch
        from bench_data import thread_seconds  # tools/ is on the path

        if torch.cuda.is_available():
            # the training's stream, where every framework here trains (a device-wide wait
            # would also wait for work a run keeps beside it, e.g. falconet's checkpoint
            # copies, which the run itself never waits for at an epoch's end)
            torch.cuda.current_stream().synchronize()
        self.ends.append(time.perf_counter())
        index = len(self.ends) - 1
        if self.reads_at is None or index in self.reads_at:
            self.cpu[index] = tree_cpu_seconds()
            self.threads[index] = thread_seconds()

    def drop_first(self) -> None:
        """Leave out the first end (a run's start, before its warm-up epoch)."""
        self.first += 1

    def drop_last(self) -> None:
        """Leave out the last end (an epoch a tracer slowed)."""
        self.dropped += 1

    def _span(self) -> tuple[int, int]:
        return self.first, len(self.ends) - 1 - self.dropped

    def cores(self) -> float:
        """CPU cores busy over the span: the training process's threads and its workers."""
        a, b = self._span()
        return (self.cpu[b] - self.cpu[a]) / (self.ends[b] - self.ends[a])

    def cores_by_thread(self) -> dict[str, float]:
        """The process's share of :meth:`cores`, by thread name (more than 0.05 each)."""
        a, b = self._span()
        span = self.ends[b] - self.ends[a]
        first, last = self.threads[a], self.threads[b]
        busy = {k: round((v - first.get(k, 0.0)) / span, 2) for k, v in last.items()}
        return {k: v for k, v in sorted(busy.items(), key=lambda kv: -kv[1]) if v > 0.05}

    def throughput(self, images_per_epoch: int) -> float:
        """images/s over the span (epochs 2..N: the first, with its warm-up, is left out)."""
        a, b = self._span()
        return images_per_epoch * (b - a) / (self.ends[b] - self.ends[a])


def tree_cpu_seconds() -> float:
    """CPU seconds so far of this process (every thread) and of its live child processes."""
    from bench_data import busy_cores  # tools/ is on the path

    children: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended, or no children file
            children += [int(pid) for pid in (task / "children").read_text().split()]
    return busy_cores(children)


def median_ms(step, warmup: int = 20, steps: int = 100) -> float:
    """Median step time: CUDA events on a GPU, the host clock on the CPU."""
    import torch

    for _ in range(warmup):
        step()
    times = []
    if not torch.cuda.is_available():
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def gpu_profile(step, steps: int = 20, rows: int = 20) -> dict:
    """GPU-busy fraction, kernels per step and host syncs per step of ``step``. Busy is the
    time some kernel ran (the union of their intervals): with a second stream
    (``wgrad_stream``) kernels overlap, and the sum of their times exceeded the wall time."""
    import warnings

    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - start) * 1e6
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    time_ms = gpu_time([(e.time_range.start, e.time_range.end) for e in kernels], steps)
    top = kernel_table(kernels, steps, rows)
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step()
        torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode(0)
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    return {
        "gpu_busy": round(1000 * time_ms["busy_ms"] * steps / wall_us, 3),
        "kernels_per_step": round(len(kernels) / steps),
        "syncs_per_step": syncs,
        "kernel_ms_per_step": time_ms["kernel_ms"],
        "busy_ms_per_step": time_ms["busy_ms"],
        "overlap_ms_per_step": time_ms["overlap_ms"],
        "top_kernels": top,
    }


def gpu_time(intervals: list[tuple[float, float]], per: int) -> dict:
    """GPU time per step (or batch; ``per`` of them traced) of kernels' ``(start, end)``
    microseconds: ``busy_ms`` the time some kernel ran (the union of the intervals),
    ``kernel_ms`` the sum of the kernels' times and ``overlap_ms`` their difference, the time
    kernels ran beside each other on two streams (``wgrad_stream``, the render's stream).
    Against the isolated step it tells a loop's batch that runs the same kernels less side by
    side (more busy time, the same kernel time) from one that runs more or slower kernels."""
    from falconet_profiler.trace import union_ms

    busy = union_ms(intervals) / per
    kernel = sum(end - start for start, end in intervals) / 1000 / per
    return {
        "busy_ms": round(busy, 3),
        "kernel_ms": round(kernel, 3),
        "overlap_ms": round(kernel - busy, 3),
    }


def kernel_table(kernels, per: int, top: int = 20) -> list[list]:
    """The ``top`` kernel names by time of profiler CUDA events (``per`` steps traced), each
    ``[name, count, ms]`` per step, so a step and a training loop's batch can be compared
    kernel by kernel (their sum is :func:`gpu_time`'s ``kernel_ms``)."""
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        entry = by_name.setdefault(e.name, [0, 0.0])
        entry[0] += 1
        entry[1] += e.time_range.elapsed_us()
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
    return [[name[:90], round(n / per, 2), round(t / per / 1000, 4)] for name, (n, t) in ranked]


def idle_gaps(intervals: list[tuple[float, float]], large_us: float = 100.0) -> dict:
    """Where a traced span's GPU sat idle, from its kernels' ``(start, end)`` microseconds:
    the gaps of ``large_us`` or more (each ``[ms after the first kernel, ms long]``, the
    longest 16, in time order) and the total of the smaller ones (the launch gaps inside
    a replayed graph, which an isolated step has too)."""
    gaps, reach, first = [], None, None
    for start, end in sorted(intervals):
        if reach is not None and start > reach:
            gaps.append((reach, start - reach))
        first = start if first is None else first
        reach = end if reach is None else max(reach, end)
    large = [g for g in gaps if g[1] >= large_us]
    longest = sorted(sorted(large, key=lambda g: -g[1])[:16])
    return {
        "large_ms": round(sum(g[1] for g in large) / 1000, 3),
        "large_count": len(large),
        "small_ms": round(sum(g[1] for g in gaps if g[1] < large_us) / 1000, 3),
        "longest": [
            [round((at - first) / 1000, 2), round(length / 1000, 3)] for at, length in longest
        ],
    }


class StackSampler:
    """Where one thread's time goes, by sampling its stack every ``interval`` seconds from a
    thread of its own (``sys._current_frames``): the innermost frames of falconet's and
    torch's Python code, waits included (a blocking call is a frame that stays on top), which
    a tracer of torch operations does not see. While it samples, the interpreter's switch
    interval is ``interval`` too (5 ms by default): a thread running Python would otherwise
    hand the GIL to the sampler only every 5 ms, and samples would fall mostly in waits."""

    def __init__(self, thread_id: int, interval: float = 0.0005, depth: int = 6) -> None:
        self.thread_id, self.interval, self.depth = thread_id, interval, depth
        self.phase = "all"  # set by the owner: samples are counted by phase
        self.counts: dict[str, dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def start(self) -> None:
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(self.interval)
        self._thread.start()

    def stop(self, top: int = 25) -> dict:
        self._stop.set()
        self._thread.join()
        sys.setswitchinterval(self._switch)
        result = {}
        for phase, counts in self.counts.items():
            samples = sum(counts.values())
            ranked = sorted(counts.items(), key=lambda item: -item[1])[:top]
            result[phase] = {
                "samples": samples,
                "top_stacks": [[stack, round(n / samples, 4)] for stack, n in ranked],
            }
        return result

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                continue
            names = []
            while frame is not None and len(names) < self.depth:
                code = frame.f_code
                names.append(f"{Path(code.co_filename).name}:{frame.f_lineno}:{code.co_name}")
                frame = frame.f_back
            counts = self.counts.setdefault(self.phase, {})
            key = " < ".join(names)
            counts[key] = counts.get(key, 0) + 1


class EpochTrace:
    """Where a run's late epochs go (``--trace-last-epoch``): the main thread's stacks
    sampled over the second-last epoch (:class:`StackSampler`) and a torch.profiler trace of
    the last (the kernels per batch, beside the isolated step's, :func:`gpu_profile`). Both
    epochs are left out of the run's img/s (the sampler's and the tracer's host cost)."""

    def __init__(self, epochs: int, rows: int = 20) -> None:
        self.epochs, self.rows, self.seen, self.profiler, self.start = epochs, rows, 0, None, 0.0
        self.sampler: StackSampler | None = None
        self.result: dict = {}

    def on_epoch_start(self, trainer) -> None:
        self.seen += 1
        if self.seen == self.epochs - 1:
            self.sampler = StackSampler(threading.get_ident())
            self.sampler.phase = "first batch"  # until the first batch ends (on_step_end)
            self.sampler.start()
        if self.seen == self.epochs:
            import torch
            from torch.profiler import ProfilerActivity, profile

            torch.cuda.synchronize()
            self.profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.profiler.__enter__()
            self.start = time.perf_counter()

    def on_step_end(self, trainer) -> None:
        if self.sampler is not None:
            self.sampler.phase = "later batches"

    def on_epoch_end(self, trainer, row) -> None:
        if self.sampler is not None:
            self.result["sampled_epoch"] = self.sampler.stop()
            self.sampler = None
        if self.profiler is None:
            return
        import torch

        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - self.start) * 1000
        self.profiler.__exit__(None, None, None)
        events = self.profiler.events()
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        batches = trainer.batch_in_epoch
        intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
        time_ms = gpu_time(intervals, batches)
        table = kernel_table(kernels, batches, self.rows)
        self.result["idle"] = idle_gaps(intervals)
        self.result |= {
            "batches": batches,
            "wall_ms_per_batch": round(wall_ms / batches, 3),
            "busy_ms_per_batch": time_ms["busy_ms"],
            "overlap_ms_per_batch": time_ms["overlap_ms"],
            "kernels_per_batch": round(len(kernels) / batches),
            "kernel_ms_per_batch": time_ms["kernel_ms"],
            "top_kernels": table,
        }
        self.profiler = None


# ---------------------------------------------------------------------------- the arms
class GraphLog(logging.Handler):
    """The graph backend's log lines of a run (each capture with its host time and phases, a
    capture that failed), kept for the results: a worker's own log is not kept."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("graph="):
            self.lines.append(message)

    def __enter__(self) -> GraphLog:
        logger = logging.getLogger("falconet.train")
        self._level = logger.level
        logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
        logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logger = logging.getLogger("falconet.train")
        logger.removeHandler(self)
        logger.setLevel(self._level)


def recordings(trainer) -> dict:
    """What the run's graph backend spent on recording: captures made and their host wall
    time (warm-up passes included), and the batches it left to run eagerly (the step's
    capture statistics); empty when it records nothing."""
    stats = trainer.run.step.stats()
    if not stats.captures:
        return {}
    return {
        "captures": stats.recorded,
        "capture_s": round(stats.capture_seconds, 3),
        "eager_batches": stats.eager,
    }


def run_falconet(args) -> dict:
    import torch

    from falconet.data.loader import stop_workers
    from falconet.data.targets import Targets, fits
    from falconet.plugins import get_plugins
    from falconet.training.planning import plan_run
    from falconet.training.trainer import Trainer

    plugins = get_plugins()
    keys = dict(
        data=str(args.data_yaml),
        epochs=args.epochs,
        batch=args.batch,
        imgsz=args.imgsz,
        workers=args.workers,
        cache="ram",
        amp_dtype=args.amp,
        val=False,
        plots=False,
        close_mosaic=0,
        deterministic=False,
        project=args.tmp,
        name="falconet",
    )
    keys.update(args.arm_keys)  # an arm's own keys win (``falconet:amp_dtype=fp16``)
    result: dict = {}
    if args.measure == "overfit":
        overfit = args.data_yaml.with_name("overfit.yaml")
        keys.update(
            data=str(overfit),
            val=True,
            epochs=args.overfit_epochs,
            val_interval=args.overfit_epochs,
        )
        summary = Trainer(plan_run(keys, plugins), plugins).fit()
        return {
            "map50_95": summary["metrics"]["AP"],
            "map50": summary["metrics"]["AP50"],
            "evaluator": "falconet (pycocotools numbers)",
            "graph": summary["graph"],
        }
    if args.measure == "e2e":
        traced = args.trace_last_epoch and torch.cuda.is_available()
        # CPU read at the span's two ends: epoch 1's end, and the last end (the traced epochs
        # left out)
        clock = EpochClock({1, args.epochs - 2 if traced else args.epochs})
        callback = SimpleCallback(clock)
        callbacks = [callback]
        if traced:
            callbacks.append(EpochTrace(args.epochs, args.kernel_rows))
        trainer = Trainer(plan_run(keys, plugins), plugins, callbacks)
        result["graph"] = trainer.run.graph  # what ran: a backend that declines runs eager
        saves = timed_calls(trainer, "_save")
        copies = timed_calls(trainer.checkpoints, "copy")  # at each epoch's last batch
        waits = timed_calls(trainer.checkpoints, "wait")  # inside each copy, and fit's last
        images = len(trainer.run.train_loader.dataset)
        clock.tick()  # the start of epoch 1 counts as an end, so epoch 1 is left out below
        from collector_log import CollectorLog  # tools/ is on the path

        collections = CollectorLog(clock.ends[0]).start()
        with GraphLog() as graph_log:
            trainer.fit()
        collections.stop()
        # the garbage collections during fit (seconds from its start): a full one holds the
        # training thread (falconet.training.collector)
        result["collections"] = collections.summary()
        result["graph_log"] = graph_log.lines
        # every epoch's wall time, epoch 1 included: where a short run's time goes
        result["epoch_s"] = [round(b - a, 3) for a, b in itertools.pairwise(clock.ends)]
        result["epoch_batches_s"] = callback.loops  # epoch_s less this: the epochs' ends
        # the training thread's time handing each epoch's checkpoint to the writer (the
        # counters and states gathered, the thread started); in the next epoch_s
        result["save_s"] = saves
        # the copies of the checkpoint's tensors, queued at each epoch's last batch (in its
        # batches' time), of which the wait for the previous epoch's files to be written (the
        # last entry is fit's own wait for the last files)
        result["copy_s"] = copies
        result["save_wait_s"] = waits
        result.update(callback.boundaries(clock.ends))
        result["first_batch_s"] = callback.first_batches
        # seconds from the start of fit to each batch end of epoch 1, on the host's clock
        result["epoch1_batch_ends_s"] = [round(t - clock.ends[0], 3) for t in callback.first_epoch]
        clock.drop_first()
        if traced:  # the sampled and traced epochs are left out of img/s
            result["trace_last_epoch"] = callbacks[1].result
            clock.drop_last()
            clock.drop_last()
        result["img_s"] = clock.throughput(images)
        result["cpu_cores"] = round(clock.cores(), 2)
        result["cpu_cores_by_thread"] = clock.cores_by_thread()
        result["loss_last_epoch"] = trainer.state.logged
        result.update(recordings(trainer))
    else:
        start = time.perf_counter()
        trainer = Trainer(plan_run({**keys, "epochs": 1}, plugins), plugins)
        run = trainer.run
        result["graph"] = run.graph
        batch = next(iter(run.train_loader))
        # the loader's workers are done: left running, torch 2.11 spent 5 s per worker joining
        # them at exit (an arm's process outlived its measurement by 40 s; stop_workers)
        stop_workers(run.train_loader)
        device = run.device
        images = batch["images"].to(device).float().div_(255)
        targets = Targets.from_batch(batch).to(device)
        if args.bucket:  # the step of a larger target bucket, on the same batch
            if not fits(targets.bucket, args.bucket):
                raise SystemExit(f"--bucket {args.bucket}: the batch's is {targets.bucket}")
            targets = targets.padded(args.bucket)
        result["bucket"] = targets.bucket  # (M, N): what the loss's assigner works on
        if hasattr(run.precision, "converted"):  # amp_dtype=fp8: the layers in FP8
            result["fp8_converted"] = len(run.precision.converted)

        def step() -> None:
            run.step(images, targets, update=True)

        # where an arm's minute goes (set-up, timed steps, the profiled steps), to plan calls
        seconds = {"setup": time.perf_counter() - start}
        start = time.perf_counter()
        result["step_ms"] = median_ms(step, args.warmup, args.steps)
        seconds["timed"] = time.perf_counter() - start
        if torch.cuda.is_available() and args.gpu_profile:
            start = time.perf_counter()
            result.update(gpu_profile(step, rows=args.kernel_rows))
            seconds["profile"] = time.perf_counter() - start
        result["seconds"] = {k: round(v, 1) for k, v in seconds.items()}
    return result


def target_bucket(text: str) -> tuple[int, int]:
    """``--bucket``'s ``M,N``: two positive integers."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a target bucket is two positive integers, M,N (e.g. 128,1024)"
        )
    return int(parts[0]), int(parts[1])


def timed_calls(owner, name: str, synchronize=None) -> list[float]:
    """Seconds of every later call of ``owner.name``, appended to the list returned; the
    call itself runs unchanged (a timer around it, for a benchmark's record). With
    ``synchronize`` (the device's), it is called before and after each call, so the call's
    GPU work is in its seconds and no earlier work is."""
    calls: list[float] = []
    method = getattr(owner, name)
    wait = synchronize or (lambda: None)

    def timed(*args, **kwargs):
        wait()
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            wait()
            calls.append(round(time.perf_counter() - start, 4))

    setattr(owner, name, timed)
    return calls


class SimpleCallback:
    """falconet's side of the e2e clock, and where an epoch's time goes beside its batches."""

    def __init__(self, clock: EpochClock) -> None:
        self.clock = clock
        self.loops: list[float] = []  # the trainer's own time for each epoch's batches
        self.first_epoch: list[float] = []  # host clock at each of epoch 1's batch ends
        self.starts: list[float] = []  # host clock at each epoch's start
        self.first_batches: list[float] = []  # each epoch's first batch, from its start

    def on_epoch_start(self, trainer) -> None:
        self.starts.append(time.perf_counter())

    def on_step_end(self, trainer) -> None:
        if not self.loops:  # epoch 1: where a run's start-up goes (no sync added)
            self.first_epoch.append(time.perf_counter())
        if trainer.batch_in_epoch == 1:
            self.first_batches.append(round(time.perf_counter() - self.starts[-1], 4))

    def on_epoch_end(self, trainer, row) -> None:
        self.clock.tick()
        self.loops.append(row["epoch_time"])

    def boundaries(self, ticks: list[float]) -> dict[str, list[float]]:
        """Each epoch's time outside its batches, in two parts: ``before_s``, from the
        previous epoch's end (``ticks``, the clock's, the run's start first) to this epoch's
        start (the checkpoint, the stop agreement); ``after_s``, from the end of its batches
        to its end (its results row, the loggers, the clock's own reads)."""
        before = [start - tick for tick, start in zip(ticks, self.starts, strict=False)]
        after = [
            tick - start - loop
            for tick, start, loop in zip(ticks[1:], self.starts, self.loops, strict=False)
        ]
        return {
            "before_s": [round(v, 4) for v in before],
            "after_s": [round(v, 4) for v in after],
        }


def _offline_ultralytics(tmp: Path) -> None:
    """What Ultralytics needs to run without a network (docs/benchmarks.md)."""
    config = tmp / "ultralytics-config"
    config.mkdir(parents=True, exist_ok=True)
    os.environ.update(YOLO_OFFLINE="1", YOLO_AUTOINSTALL="0", YOLO_CONFIG_DIR=str(config))
    (config / "settings.json").write_text(json.dumps({"sync": False}))
    import matplotlib

    font = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    shutil.copy(font, config / "Arial.ttf")


def ultralytics_overrides(data, epochs, batch, imgsz, workers, cache, project) -> dict:
    """Ultralytics' training keys as every arm of ours sets them: yolo26n from scratch, AMP,
    mosaic throughout, no validation or plots, offline (:func:`_offline_ultralytics`)."""
    return dict(
        model="yolo26n.yaml",
        data=str(data),
        epochs=epochs,
        batch=batch,
        imgsz=imgsz,
        workers=workers,
        cache=cache,
        amp=True,
        pretrained=False,
        plots=False,
        close_mosaic=0,
        deterministic=False,
        val=False,
        project=project,
        name="ultralytics",
        exist_ok=True,
        verbose=False,
    )


def run_ultralytics(args) -> dict:
    _offline_ultralytics(Path(args.tmp))
    import torch
    from ultralytics.engine.trainer import BaseTrainer
    from ultralytics.models.yolo.detect import DetectionTrainer

    # its polars dependency (a 54 MB wheel) only reads results.csv back for checkpoints
    BaseTrainer.read_results_csv = lambda self: {}
    overrides = ultralytics_overrides(
        args.data_yaml, args.epochs, args.batch, args.imgsz, args.workers, "ram", args.tmp
    )
    result: dict = {}
    if args.measure == "overfit":  # val=False still validates the final epoch
        data = str(args.data_yaml.with_name("overfit.yaml"))
        trainer = DetectionTrainer(
            overrides={**overrides, "data": data, "epochs": args.overfit_epochs}
        )
        trainer.train()
        return {
            "map50_95": float(trainer.metrics["metrics/mAP50-95(B)"]),
            "map50": float(trainer.metrics["metrics/mAP50(B)"]),
            "evaluator": "ultralytics",
        }
    if args.measure == "e2e":
        clock = EpochClock({1, args.epochs})  # the span's ends: epochs 2..N
        trainer = DetectionTrainer(overrides=overrides)
        trainer.add_callback("on_train_start", lambda t: clock.tick())
        trainer.add_callback("on_train_epoch_end", lambda t: clock.tick())
        trainer.train()
        clock.drop_first()
        images = len(trainer.train_loader.dataset)
        result["img_s"] = clock.throughput(images)
        result["cpu_cores"] = round(clock.cores(), 2)
        losses = trainer.tloss  # a dict in 8.4, a tensor in older releases
        if not isinstance(losses, dict):
            losses = dict(zip(trainer.loss_names, losses.tolist(), strict=False))
        result["loss_last_epoch"] = {k: float(v) for k, v in losses.items()}
    else:
        trainer = DetectionTrainer(overrides={**overrides, "epochs": 1})
        trainer._setup_train()
        batch = trainer.preprocess_batch(next(iter(trainer.train_loader)))

        def step() -> None:
            with torch.autocast("cuda", dtype=torch.float16, enabled=trainer.amp):
                loss, _ = trainer.model(batch)
            trainer.scaler.scale(loss.sum()).backward()
            trainer.optimizer_step()  # unscale, clip, step, scaler update, zero_grad, EMA

        result["step_ms"] = median_ms(step, args.warmup, args.steps)
    return result


def run_libreyolo(args) -> dict:
    from libreyolo import LibreYOLO9

    clock = EpochClock({1, args.epochs})  # the span's ends: epochs 2..N

    class Clock:
        def on_train_start(self, event) -> None:
            clock.tick()

        def on_train_epoch_end(self, event) -> None:
            clock.tick()

    overfit = args.measure == "overfit"
    model = LibreYOLO9(model_path=None, size="t", nb_classes=80)
    out = model.train(
        data=str(args.data_yaml.with_name("overfit.yaml") if overfit else args.data_yaml),
        epochs=args.overfit_epochs if overfit else args.epochs,
        batch=args.batch,
        imgsz=args.imgsz,
        workers=args.workers,
        amp=True,
        project=args.tmp,
        name="libreyolo",
        exist_ok=True,
        callbacks=[Clock()],
        no_aug_epochs=0,
        cache="ram",
        eval_interval=args.overfit_epochs if overfit else 0,  # overfit: the last one only
    )
    if overfit:
        return {
            "map50_95": out["best_mAP50_95"],
            "map50": out["best_mAP50"],
            "final_loss": out["final_loss"],
            "evaluator": "libreyolo",
        }
    clock.drop_first()
    return {
        "img_s": clock.throughput(128 * args.repeat_data),
        "cpu_cores": round(clock.cores(), 2),
        "loss_last_epoch": out.get("final_loss"),
    }


def rfdetr_dataset(data_yaml: Path, folder: Path, overfit: bool) -> Path:
    """The run's data as the COCO-format folders RF-DETR reads (``train/`` and ``valid/``, each
    with its ``_annotations.coco.json``), written from the YOLO labels every other arm trains on:
    the same boxes and the same 80 classes (category ids 0-79, YOLO's), the images by symlink.
    The overfit's train split is COCO128 once, as overfit.yaml's is."""
    import yaml
    from PIL import Image

    source = data_yaml.parent
    names = yaml.safe_load(data_yaml.read_text())["names"]
    names = dict(enumerate(names)) if isinstance(names, list) else names
    categories = [{"id": int(k), "name": v, "supercategory": "none"} for k, v in names.items()]
    for split, images in (("train", "val" if overfit else "train"), ("valid", "val")):
        out = folder / split
        out.mkdir(parents=True)
        entries, boxes = [], []
        for index, image in enumerate(sorted((source / "images" / images).iterdir())):
            (out / image.name).symlink_to(image)
            with Image.open(image) as opened:  # reads the header only
                width, height = opened.size
            entries.append({"id": index, "file_name": image.name, "width": width, "height": height})
            label = source / "labels" / images / f"{image.stem}.txt"
            for line in label.read_text().splitlines() if label.exists() else []:
                cls, cx, cy, w, h = (float(v) for v in line.split()[:5])  # normalised centre, size
                box = [(cx - w / 2) * width, (cy - h / 2) * height, w * width, h * height]
                boxes.append(
                    {
                        "id": len(boxes),
                        "image_id": index,
                        "category_id": int(cls),
                        "bbox": box,
                        "area": box[2] * box[3],
                        "iscrowd": 0,
                    }
                )
        coco = {"images": entries, "annotations": boxes, "categories": categories}
        (out / "_annotations.coco.json").write_text(json.dumps(coco))
    return folder


def _offline_rfdetr(home: Path) -> None:
    """What RF-DETR needs to run without a network. Nano's DINOv2 encoder (patch 16) is built
    from the config JSON the package ships, never fetched, and ``pretrain_weights=None`` skips
    the checkpoint download; the Hugging Face switches make any other hub access fail at once
    instead of waiting on the network, and ``RF_HOME`` keeps its model cache in the run's folder."""
    os.environ.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", RF_HOME=str(home)
    )


def run_rfdetr(args) -> dict:
    """RF-DETR Nano (Roboflow's ``rfdetr``) from random init, trained by its own Lightning stack:
    its ``RFDETRModelModule`` (the network, its criterion, and the AdamW with layer-wise
    learning-rate decay that its ``configure_optimizers`` builds), its ``RFDETRDataModule`` (its
    COCO reader and augmentation) and the ``Trainer`` its ``build_trainer`` assembles (precision,
    gradient clipping at 0.1, its EMA callback, its checkpoints). ``RFDETR.train`` is those
    three calls and ``fit``; they are called here directly so that a clock can be added as a
    Lightning callback.

    Precision: ``amp_dtype=bf16`` (its trainer's choice on an H200 by default): Lightning's
    ``bf16-mixed``, bf16 autocast over fp32 weights, no loss scaler, fused AdamW; fp32 matmuls in
    TF32 (``build_trainer`` sets ``float32_matmul_precision("high")``). On a CPU it trains in
    fp32 whatever is asked. Resolution: the arm's ``imgsz`` (``rfdetr:imgsz=384``, Nano's
    native size; else ``--imgsz``), a multiple of 32; multi-scale is off (its default trains at
    11 sizes around it), so every batch is that square size, as the other arms' are.

    Variants are its own: ``cuda_graphs=true`` captures the training forward as a CUDA graph
    (loss, backward and optimizer stay eager; bf16 only, else it warns and runs eager:
    ``cuda_graphs_ran`` says which ran), ``compile=true`` is ``torch.compile``, both together
    Inductor's CUDA graph trees. Any other key is a field of its ``ModelConfig`` or
    ``TrainConfig`` (``rfdetr:lr=0.0002``; ``amp_dtype=fp16``: fp16 autocast with its loss
    scaler), validated by its pydantic configs, so a misspelt key fails the arm.

    * step: one fixed batch of its own loader, on the device before the run, fed to its own
      ``fit`` ``--warmup`` + ``--steps`` times; a step is from its batch start to its batch end
      (forward, loss, backward, clipping, AdamW, zero_grad, the EMA update, Lightning's
      per-step logging), timed by CUDA events and synchronised, median after the warm-up.
    * e2e: its whole loop, validation off (``limit_val_batches=0``); images per epoch are its
      batches times the batch size (it pads the set to whole batches). It has no RAM cache:
      its reader decodes every JPEG every epoch.
    * overfit: validated once, after the last epoch, by its own evaluator (the EMA weights,
      ``faster_coco_eval``: the backend shipped for its import anyway; its default ``vernier``
      gives the same numbers) at COCO's 100 detections per image (its default is 500).

    Like Ultralytics', its host syncs and kernels are not counted."""
    folder = Path(args.tmp) / f"rfdetr-{os.getpid()}"  # measurements may run side by side
    try:
        return _rfdetr_measure(args, folder)
    finally:  # its checkpoints: some 0.85 GB a measurement, a run's many would fill the disk
        shutil.rmtree(folder, ignore_errors=True)


def _rfdetr_measure(args, folder: Path) -> dict:
    import statistics

    import torch
    from pytorch_lightning import Callback

    _offline_rfdetr(folder / "home")
    from rfdetr.config import RFDETRNanoConfig, TrainConfig
    from rfdetr.training import RFDETRDataModule, RFDETRModelModule, build_trainer

    measure = args.measure
    keys = dict(args.arm_keys)
    resolution = int(keys.pop("imgsz", args.imgsz))
    model_keys = {k: keys.pop(k) for k in list(keys) if k in RFDETRNanoConfig.model_fields}
    model_config = RFDETRNanoConfig(
        pretrain_weights=None, resolution=resolution, num_classes=80, **model_keys
    )
    train_keys = dict(
        dataset_dir=str(rfdetr_dataset(args.data_yaml, folder / "data", measure == "overfit")),
        output_dir=str(folder / "run"),
        epochs={"overfit": args.overfit_epochs, "step": 1}.get(measure, args.epochs),
        batch_size=args.batch,
        num_workers=0 if measure == "step" else args.workers,  # step: one batch, read here
        amp_dtype="bf16",
        multi_scale=False,
        tensorboard=False,
        progress_bar=None,
        eval_backend="faster_coco_eval",
        eval_max_dets=100,
        eval_interval=args.overfit_epochs if measure == "overfit" else 1,
    )
    train_config = TrainConfig(**{**train_keys, **keys})  # an arm's own keys win
    module = RFDETRModelModule(model_config, train_config)
    no_val = {} if measure == "overfit" else {"limit_val_batches": 0}
    trainer = build_trainer(train_config, model_config, **no_val)
    result: dict = {}
    if measure == "overfit":
        trainer.fit(module, RFDETRDataModule(model_config, train_config))
        metrics = trainer.callback_metrics
        return {
            "map50_95": float(metrics["val/mAP_50_95"]),
            "map50": float(metrics["val/mAP_50"]),
            "evaluator": "rfdetr (faster-coco-eval, EMA weights)",
        }
    if measure == "e2e":
        clock = EpochClock({1, args.epochs})  # the span's ends: epochs 2..N

        class Clock(Callback):
            def on_train_start(self, trainer, pl_module) -> None:
                clock.tick()

            def on_train_epoch_end(self, trainer, pl_module) -> None:
                clock.tick()

        trainer.callbacks.append(Clock())
        trainer.fit(module, RFDETRDataModule(model_config, train_config))
        clock.drop_first()
        result["img_s"] = clock.throughput(trainer.num_training_batches * args.batch)
        result["cpu_cores"] = round(clock.cores(), 2)
        result["loss_last_epoch"] = {  # its logged epoch means (class_error and such left out)
            k.removeprefix("train/"): float(v)
            for k, v in trainer.callback_metrics.items()
            if k.startswith("train/loss")
        }
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

        class Repeated:
            """One batch ``count`` times: what Lightning takes for a loader (a list it would
            take for a list of loaders)."""

            def __init__(self, batch, count: int) -> None:
                self.batch, self.count = batch, count

            def __len__(self) -> int:
                return self.count

            def __iter__(self):
                return itertools.repeat(self.batch, self.count)

        class OneBatch(RFDETRDataModule):
            """Its data module; once ``batch`` is set, it serves that batch at every step."""

            batch = None

            def train_dataloader(self):
                if self.batch is None:
                    return super().train_dataloader()
                return Repeated(self.batch, args.warmup + args.steps)

        class StepClock(Callback):
            """Each step, batch start to batch end: appended last, so after the EMA update."""

            def __init__(self) -> None:
                self.ms: list[float] = []

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
                if device.type == "cuda":
                    self.start = torch.cuda.Event(enable_timing=True)
                    self.start.record()
                else:
                    self.start = time.perf_counter()

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
                if device.type == "cuda":
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()
                    end.synchronize()
                    self.ms.append(self.start.elapsed_time(end))
                else:
                    self.ms.append((time.perf_counter() - self.start) * 1e3)

        datamodule = OneBatch(model_config, train_config)
        datamodule.setup("fit")
        first = next(iter(datamodule.train_dataloader()))
        datamodule.batch = datamodule.transfer_batch_to_device(first, device, 0)
        steps = StepClock()
        trainer.callbacks.append(steps)
        trainer.fit(module, datamodule)
        result["step_ms"] = statistics.median(steps.ms[args.warmup :])
    result["precision"] = str(trainer.precision)
    # what ran (its module's own flags): it sets them only where its checks let capture go on
    result["cuda_graphs_ran"] = module._cuda_graph_runner is not None or module._inductor_cudagraphs
    return result


ARMS = {
    "falconet": run_falconet,
    "ultralytics": run_ultralytics,
    "libreyolo": run_libreyolo,
    "rfdetr": run_rfdetr,
}


# ------------------------------------------------------------------------ orchestration
ENV_PREFIXES = ("TORCHINDUCTOR_", "FALCONET_BN_SILU_")  # settings read from the environment


def _arm_keys(arm: str) -> tuple[str, dict[str, str]]:
    name, *pairs = arm.split(":")
    return name, dict(pair.split("=", 1) for pair in pairs if pair)


def parse_arm(arm: str) -> tuple[str, dict[str, str]]:
    """``falconet:graph=cuda-graph:batch=8`` -> ``("falconet", {"graph": "cuda-graph", ...})``.
    Settings read from the environment (:func:`arm_env`) are not among the keys."""
    name, keys = _arm_keys(arm)
    return name, {k: v for k, v in keys.items() if not k.startswith(ENV_PREFIXES)}


def arm_env(arm: str) -> dict[str, str]:
    """An arm's settings that are read from the environment (Inductor's, the fused
    BatchNorm's tiling), set in its process's environment rather than passed as training
    keys: ``falconet:fuse=inductor-all:TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1`` times one
    tuning beside the untuned arm in the same call, ``...:bn_silu=triton:
    FALCONET_BN_SILU_MAP_WARPS=8`` one tiling beside another."""
    return {k: v for k, v in _arm_keys(arm)[1].items() if k.startswith(ENV_PREFIXES)}


def worker(args) -> None:
    """One measurement; ``--worker`` is an arm, optionally with falconet keys after colons
    (``falconet:optimizer=adamw:lr0=0.000119``)."""
    entered = time.perf_counter()
    result = {"arm": args.worker, "batch": args.batch, "measure": args.measure}
    name, args.arm_keys = parse_arm(args.worker)
    try:
        result.update(ARMS[name](args))
    except Exception as exc:  # one failed arm must not lose the others' numbers
        result["error"] = f"{type(exc).__name__}: {exc}"
    # the arm's whole time, its imports included; spawn() adds the process's (start and exit)
    result["worker_s"] = round(time.perf_counter() - entered, 1)
    print(MARK + json.dumps(result, default=str), flush=True)


def spawn(
    args, arm: str, batch: int, measure: str, data_yaml: Path, tmp: Path, gpu: str | None
) -> dict:
    """Run one measurement in a fresh process (alone on ``gpu`` when given)."""
    command = [
        sys.executable,
        __file__,
        "--worker",
        arm,
        "--batch",
        str(batch),
        "--measure",
        measure,
        "--data-yaml",
        str(data_yaml),
        "--tmp",
        str(tmp),
        "--epochs",
        str(args.epochs),
        "--imgsz",
        str(args.imgsz),
        "--workers",
        str(args.workers),
        "--amp",
        args.amp,
        "--repeat-data",
        str(args.repeat_data),
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps),
        "--overfit-epochs",
        str(args.overfit_epochs),
        "--gpu-profile" if args.gpu_profile else "--no-gpu-profile",
        "--trace-last-epoch" if args.trace_last_epoch else "--no-trace-last-epoch",
        "--kernel-rows",
        str(args.kernel_rows),
        *(["--bucket", ",".join(map(str, args.bucket))] if args.bucket else []),
    ]
    env = dict(os.environ) | arm_env(arm)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return marked_result(command, args.timeout, env, arm=arm, batch=batch, measure=measure)


def marked_result(command: list[str], timeout: float, env=None, **names) -> dict:
    """Run one measurement's process; its result line (``MARK`` + JSON) with the process's
    seconds, or ``names`` with the error (a timeout, or the output's last lines)."""
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**names, "error": "timed out"}
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            result = json.loads(line[len(MARK) :])
            result["process_s"] = round(time.perf_counter() - started, 1)
            return result
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {**names, "error": " | ".join(tail)}


def _median(results: list[dict], arm: str, batch: int, measure: str, key: str):
    values = [
        r[key]
        for r in results
        if (r["arm"], r["batch"], r["measure"]) == (arm, batch, measure) and r.get(key) is not None
    ]
    return statistics.median(values) if values else None


def speed_table(results: list[dict], arms: list[str], batches: list[int]) -> str:
    """Medians over repeats, with the end-to-end ratio to Ultralytics at the same batch."""
    lines = [
        "| arm | batch | end-to-end img/s | vs Ultralytics | step ms | GPU busy | "
        "kernels/step | syncs/step | runs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for batch in batches:
        base = _median(results, "ultralytics", batch, "e2e", "img_s")
        for arm in arms:
            e2e = _median(results, arm, batch, "e2e", "img_s")
            cells = ["-" if e2e is None else f"{e2e:.0f}"]
            cells.append(f"{e2e / base:.2f}x" if e2e and base else "-")
            for key, form in (
                ("step_ms", "{:.1f}"),
                ("gpu_busy", "{:.2f}"),
                ("kernels_per_step", "{:,.0f}"),
                ("syncs_per_step", "{:.0f}"),
            ):
                value = _median(results, arm, batch, "step", key)
                cells.append("-" if value is None else form.format(value))
            runs = sum(
                1
                for r in results
                if (r["arm"], r["batch"], r["measure"]) == (arm, batch, "e2e") and "img_s" in r
            )
            cells.append(str(runs))
            lines.append(f"| {arm_label(results, arm)} | {batch} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def arm_label(results: list[dict], arm: str) -> str:
    """The arm, and what ran where it is not what the arm named: a falconet arm asking for
    ``graph=whole-step`` in fp16 runs eager, and its row must not pass for whole-step's; an
    arm without a graph key runs the default ``auto``, and its row says what that chose."""
    name, keys = parse_arm(arm)
    wanted = keys.get("graph", "auto")
    ran = sorted({r["graph"] for r in results if r["arm"] == arm and r.get("graph")} - {wanted})
    return f"{arm} (ran graph={', '.join(ran)})" if name == "falconet" and ran else arm


def accuracy_table(results: list[dict], arms: list[str]) -> str:
    """The overfit mAP per arm and the losses of a timed run's last epoch (own loss terms)."""
    lines = [
        "| arm | overfit mAP50-95 | overfit mAP50 | evaluator | last-epoch losses (batch) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for arm in arms:
        fit = next((r for r in results if r["arm"] == arm and r["measure"] == "overfit"), {})
        timed = next(
            (r for r in results if r["arm"] == arm and r.get("loss_last_epoch") is not None), {}
        )
        losses = timed.get("loss_last_epoch")
        if isinstance(losses, dict):
            losses = ", ".join(  # falconet's log also holds img/s and gpu_mem
                f"{k} {v:.3g}"
                for k, v in losses.items()
                if isinstance(v, int | float) and k not in ("img/s", "gpu_mem")
            )
        elif isinstance(losses, int | float):
            losses = f"total {losses:.3g}"
        cells = [
            "-" if fit.get("map50_95") is None else f"{fit['map50_95']:.3f}",
            "-" if fit.get("map50") is None else f"{fit['map50']:.3f}",
            fit.get("evaluator", fit.get("error", "-")),
            f"{losses} ({timed['batch']})" if losses else "-",
        ]
        lines.append(f"| {arm_label(results, arm)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def jobs(args, arms: list[str], batches: list[int]) -> list[tuple[str, int, str, int]]:
    """(arm, batch, measure, repeat) in run order: arms alternate between repeats; the
    overfit runs once per arm, at ``--overfit-batch``."""
    measures = args.measures.split(",")
    planned = []
    for repeat in range(args.repeats):
        order = arms if repeat % 2 == 0 else arms[::-1]
        for batch in batches:
            for arm in order:
                for measure in measures:
                    if measure == "overfit":
                        continue
                    if measure == "step" and arm.startswith("libreyolo"):
                        continue  # its step is not reachable from outside its trainer
                    planned.append((arm, batch, measure, repeat))
    if "overfit" in measures:
        planned += [(arm, args.overfit_batch, "overfit", 0) for arm in arms]
    return planned


def run_all(args, planned, data_yaml: Path, tmp: Path, results: list[dict], save) -> None:
    """Run ``planned`` one at a time, or one per GPU of ``--gpus`` at a time."""
    gpus = args.gpus.split(",") if args.gpus else [None]
    lock = threading.Lock()
    queue = list(planned)

    def lane(gpu: str | None) -> None:
        while True:
            with lock:
                if not queue:
                    return
                arm, batch, measure, repeat = queue.pop(0)
            result = spawn(args, arm, batch, measure, data_yaml, tmp, gpu)
            result.update(repeat=repeat, gpu=gpu)
            with lock:
                print(json.dumps(result, default=str), file=sys.stderr, flush=True)
                results.append(result)
                save()

    threads = [threading.Thread(target=lane, args=(gpu,)) for gpu in gpus]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def report(results: list[dict], arms: list[str], batches: list[int]) -> str:
    return speed_table(results, arms, batches) + "\n\n" + accuracy_table(results, arms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(".data/coco128"))
    parser.add_argument("--arms", default="falconet,ultralytics,libreyolo")
    parser.add_argument("--batch", default="16,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeat-data", type=int, default=4)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--amp", default="fp16", help="falconet's amp_dtype (peers use fp16)")
    parser.add_argument("--measures", default="e2e,step,overfit")
    parser.add_argument(
        "--overfit-epochs", type=int, default=30, help="accuracy: epochs of the COCO128 overfit"
    )
    parser.add_argument("--overfit-batch", type=int, default=16, help="accuracy: its batch")
    parser.add_argument("--warmup", type=int, default=20, help="isolated step: warm-up steps")
    parser.add_argument("--steps", type=int, default=100, help="isolated step: timed steps")
    parser.add_argument("--gpus", help="run measurements in parallel, one per GPU: 0,1")
    parser.add_argument(
        "--gpu-profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="isolated step: GPU busy, kernels and syncs per step (20-40 s an arm on a DETR)",
    )
    parser.add_argument(
        "--trace-last-epoch",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="falconet e2e: sample the main thread's stacks over the second-last epoch and "
        "trace the last one's kernels (both left out of img/s)",
    )
    parser.add_argument(
        "--kernel-rows",
        type=int,
        default=20,
        help="kernel tables (--gpu-profile, --trace-last-epoch): how many kernels, by time",
    )
    parser.add_argument(
        "--bucket",
        type=target_bucket,
        help="isolated step: pad the batch's targets to this target bucket, M,N (the step "
        "a run replays once it has recorded a larger one)",
    )
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table-from", nargs="+", type=Path, help="print saved runs' tables")
    # worker mode (one measurement in this process)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--measure", default="e2e", help=argparse.SUPPRESS)
    parser.add_argument("--data-yaml", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.batch = int(args.batch)
        worker(args)
        return
    arms, batches = args.arms.split(","), [int(b) for b in args.batch.split(",")]
    if args.table_from:
        saved = [json.loads(path.read_text()) for path in args.table_from]
        results = [r for run in saved for r in run["results"]]
        print(report(results, arms, batches))
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    data_yaml = repeated_dataset(args.data, args.repeat_data, tmp / "data")
    results: list[dict] = []
    settings = vars(args) | {"data": str(args.data), "out": str(args.out)}
    # what changes a compiled arm without showing in its name (levers_runs.sh's inductor_env)
    # (an arm's own, arm_env, are in its name)
    settings["environment"] = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}

    def save() -> None:
        if args.out:
            table = report(results, arms, batches)
            payload = {"settings": settings, "results": results, "table": table}
            args.out.write_text(json.dumps(payload, indent=1, default=str))

    started = time.perf_counter()
    run_all(args, jobs(args, arms, batches), data_yaml, tmp, results, save)
    print(report(results, arms, batches))
    print(f"({time.perf_counter() - started:.0f} s)")
    save()


if __name__ == "__main__":
    main()
