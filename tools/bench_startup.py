"""Where a short training run's wall time goes, from the process's start to its exit.

For a fine-tune of a few minutes the step is not the only cost: the interpreter and imports,
the data check and the RAM cache, the model on the device, the loader's workers, the first
batches (kernel loading, cuDNN's autotuning, graph recordings) and the process's exit all
count. Each measurement runs one training in a fresh process, as ``falconet train`` does
(``plan_run`` then ``Trainer.fit``), and records on the wall clock (seconds from the spawn):

* ``python``: the child's first statement (interpreter start); ``imports``: falconet and its plugins
  loaded as the ``falconet`` command loads them (``falconet.cli.load_plugins``: torch's import among
  them, the garbage collector paused), the trainer's modules imported; ``plan``: the run planned
  (keys, data yaml, model recipe); ``trainer``: the trainer built (data checks, RAM cache, model on
  the device, loaders, graph backend); ``first_batch`` and ``epoch1``: the ends of epoch 1's first
  batch and of epoch 1; ``fit``: ``fit`` returned (every epoch done and the checkpoints on disk);
  ``exit``: the process gone (the parent's clock), after the child returned as ``falconet train``
  does, leaving the trainer to the interpreter's exit;
* ``epoch_s``: each epoch's wall time; ``first_batches_phases_s``: for each of the first
  ``--phase-batches`` batches (enough to reach the first optimizer step under ``accumulate``)
  its phases (``data``, ``to-device``, ..., ``step``), each closed by a device synchronize, so
  the host wait for a batch and the device's first-use costs are told apart (those batches
  only: the synchronizes change nothing later);
* ``log``: the trainer's log lines with their times, which split ``trainer`` further;
* ``first_imports``: for each of the heavy modules a run may import (torchvision,
  ``torch._dynamo``, Triton, ...), when its first import started, how long the module took to
  execute (its own imports included), on which thread, and the frames that imported it;
* ``fill_breakdown_s`` (with ``--fill-breakdown`` only): the ``cache=gpu`` store's fill in
  parts, each call's seconds with the device synchronized before and after it (so a part's
  GPU work is its own; the parts then run one after another, not overlapped, so the run's
  points are not its own): the whole fill (``fill_store``), torchvision's ``decode_jpeg``
  calls (nvJPEG; the first one loads it) and the per-image resizes into the store (``place``);
* ``profiles`` (with ``--profile`` only): the busiest functions (``cProfile``, cumulative
  time) of the trainer's construction and of ``fit``'s start up to the first batch's end.
  ``cProfile`` slows the training thread's Python (the imports most: they are calls), so a
  profiled run's points are not the run's own; the timed runs are unprofiled by default;
* ``collections_to_first_batch`` and ``collections_to_fit_end``: the garbage collections
  from the child's start to the first batch's end and to ``fit``'s return, counted and timed
  per generation, each of 1 ms or more listed (``tools/collector_log.py``);
* ``imports_off_main``: every module a thread other than the main one imported first, with
  the thread and when (two threads importing at once is where import locks can deadlock);
* ``val_s``: with ``val=true`` in an arm, each validation's time, from the epoch's last batch
  (synchronized) to the validation's end (prediction, postprocessing, the COCO evaluation;
  the second one is in the epoch end's profile below, with ``--profile``);
* ``epoch_end_s``: each epoch's end, from its last batch (synchronized) to the next epoch's
  start (validation, the epoch's row, callbacks, the checkpoint's snapshot), and with
  ``--profile`` the second one's profile in ``profiles`` (one profiler at a time: Python 3.12
  allows no more; there it also covers other threads, such as the checkpoint writer's);
* ``workers_alive_after_fit``: how many of the train loader's workers still run when ``fit``
  has returned (left to the exit, or stopped by the trainer);
* ``workers_mib`` (Linux): the train loader's workers' memory at the end of training, summed
  over the workers from ``/proc/<pid>/smaps_rollup``: ``private`` (pages no other process
  maps: a copy of its own, such as a dataset it received pickled) and ``pss`` (shared pages
  split between their processes);
* ``exit_stacks``: when the exit takes longer than ``--stacks-after`` seconds,
  every thread's Python stack at that moment (``faulthandler``), and for each loader worker
  still alive its state and kernel wait channel (``/proc``) and its own stacks (the workers
  inherit a ``SIGUSR1`` dump handler), to say what they wait for.

    cd tools && python bench_startup.py --data ../.data/coco128/coco128.yaml \\
        --arms graph=whole-step:amp_dtype=fp16,graph=eager:amp_dtype=fp16 --repeats 2 \\
        --epochs 3 --batch 16 --out startup.json

Runs on any device; on the CPU use ``amp_dtype=bf16`` or ``fp32`` in the arms.
``--start-method forkserver`` sets the child's default start method for processes before
anything else runs, as Python 3.14 has it on Linux (3.11-3.13 default to ``fork``).
"""

from __future__ import annotations

import time

SPAWNED = time.time()  # the child's first statement (the parent passes its own spawn time)

import argparse  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pstats  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

MARK = "STARTUP "
POINTS = (
    "python", "imports", "plan", "trainer", "first_batch", "epoch1", "fit", "exit",
)  # fmt: skip


# ------------------------------------------------------------------------------ child
def _top(profile: cProfile.Profile, count: int = 25) -> str:
    """The ``count`` functions with the most cumulative time, as pstats prints them, then the
    project's own (``falconet``), which say which of its calls the time goes under."""
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text).sort_stats("cumulative")
    stats.print_stats(count)
    stats.print_stats("falconet", count)
    return text.getvalue()[-12000:]


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def _probe_workers(pids: list[int], after: float) -> None:
    """After ``after`` seconds, for each loader worker still alive: its state and kernel
    wait channel on stderr, then SIGUSR1 (its inherited faulthandler dumps its stacks)."""
    time.sleep(after)
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
            tasks = sorted(Path(f"/proc/{pid}/task").iterdir())
            waits = [(task / "wchan").read_text() for task in tasks]
        except OSError:
            continue  # gone
        print(f"WORKER {pid} state {state} threads {len(tasks)} wchan {waits}", file=sys.stderr)
        sys.stderr.flush()
        os.kill(pid, signal.SIGUSR1)
        time.sleep(0.2)


HEAVY_IMPORTS = (
    "torchvision",
    "torch._dynamo",
    "torch._inductor",
    "torch.distributed.fsdp",
    "triton",
    "triton.language",
    "cv2",
    "scipy",
    "pycocotools",
    "matplotlib",
    "transformer_engine",
)  # fmt: skip


class _FirstImports:
    """A finder that times the first import of each of :data:`HEAVY_IMPORTS`: it finds the
    module as the path finder would and wraps its loader's ``exec_module``."""

    def __init__(self, origin: float) -> None:
        self.origin = origin
        self.seen: dict[str, dict | None] = {}
        self.off_main: list[dict] = []  # every first import on a thread but the main one

    def find_spec(self, name, path=None, target=None):
        import importlib.machinery
        import traceback

        thread = threading.current_thread()
        if thread is not threading.main_thread():
            when = round(time.time() - self.origin, 3)
            self.off_main.append({"name": name, "thread": thread.name, "start_s": when})
        if name not in HEAVY_IMPORTS or name in self.seen:
            return None
        # not marked seen yet: importlib.util.find_spec asks the finders without importing
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        frames = [
            f"{Path(f.filename).name}:{f.lineno}:{f.name}"
            for f in traceback.extract_stack()[:-1]
            if "importlib" not in f.filename and f.filename != __file__
        ]
        run, seen, origin = spec.loader.exec_module, self.seen, self.origin

        def exec_module(module) -> None:
            seen[name] = None
            start = time.time()
            try:
                run(module)
            finally:
                seen[name] = {
                    "start_s": round(start - origin, 3),
                    "seconds": round(time.time() - start, 3),
                    "thread": threading.current_thread().name,
                    "from": frames[-4:],
                }

        spec.loader.exec_module = exec_module
        return spec

    def found(self) -> dict[str, dict]:
        return {k: v for k, v in self.seen.items() if v is not None}


class _FillBreakdown:
    """``--fill-breakdown``: the parts of the GPU cache's fill, each call timed between two
    device synchronizations (``bench_train.timed_calls``; module docstring,
    ``fill_breakdown_s``)."""

    def __init__(self, synchronize) -> None:
        self.synchronize = synchronize
        self.calls: dict[str, list[float]] = {}

    def install(self) -> None:
        from bench_train import timed_calls  # tools/ is on the path

        from falconet.data import gpu_cache
        from falconet.training import loaders

        self.calls["fill_store"] = timed_calls(loaders, "fill_store", self.synchronize)
        self.calls["place"] = timed_calls(gpu_cache, "place", self.synchronize)
        decode_all = gpu_cache._decode_jpegs_on_gpu

        def decode_jpegs(*args, **kwargs):
            # where nvJPEG decodes, the fill is about to import torchvision: importing it
            # here, to wrap its decoder, moves that import before the fill's first reads
            import torchvision.io

            if "decode_jpeg" not in self.calls:  # wrapped once
                self.calls["decode_jpeg"] = timed_calls(
                    torchvision.io, "decode_jpeg", self.synchronize
                )
            return decode_all(*args, **kwargs)

        gpu_cache._decode_jpegs_on_gpu = decode_jpegs

    def result(self) -> dict[str, dict]:
        return {
            name: {"calls": len(c), "seconds": round(sum(c), 3), "first": round(c[0], 3)}
            for name, c in self.calls.items()
            if c
        }


class _Timeline:
    """Callbacks and a phase timer that stamp a run's milestones on the wall clock."""

    def __init__(
        self, origin: float, synchronize, phase_batches: int, profiling: bool = False
    ) -> None:
        self.origin, self.synchronize = origin, synchronize
        self.points: dict[str, float] = {}
        self.epoch_ends: list[float] = []
        self.phase_batches = phase_batches
        self.phases: list[dict[str, float]] = [{}]  # one dict per timed batch
        self.workers: list[int] = []  # the train loader's worker pids when training ends
        self.workers_mib: dict[str, float] | None = None  # their memory then
        self.loader = None  # the train loader, set once the trainer is built
        self.batches_in_epoch = 0
        self.last_batch_ends: list[float] = []  # each epoch's last batch done (synchronized)
        self.validations: list[float] = []  # each validation's end
        self.epoch_starts: list[float] = []  # each epoch's start (before its first batch)
        self.profiling = profiling  # cProfile on: the construction, the first batch, an end
        self.profile = cProfile.Profile()  # fit's start to the first batch's end
        self.end_profile = cProfile.Profile()  # the second epoch's end, validation included
        self.end_profiled = False
        self.log: list[tuple[float, str]] = []

    def now(self) -> float:
        return round(time.time() - self.origin, 3)

    def mark(self, name: str) -> None:
        self.points.setdefault(name, self.now())

    # the step's phase seam (falconet.training.phases), installed for the first batches
    def phase(self, name: str):
        timeline = self

        class _Phase:
            def __enter__(self):
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                timeline.synchronize()
                spent = time.perf_counter() - self.start
                phases = timeline.phases[-1]
                phases[name] = round(phases.get(name, 0.0) + spent, 3)

        return _Phase()

    def on_epoch_start(self, run) -> None:
        self.batches_in_epoch = 0
        self.epoch_starts.append(self.now())
        if len(self.epoch_starts) == 3 and self.profiling:  # the second epoch's end is over
            self.end_profile.disable()
            self.end_profiled = True

    def on_train_start(self, run) -> None:
        self.mark("fit_start")
        run.phases.use(self.phase)
        if self.profiling:
            self.profile.enable()

    def on_step_end(self, run) -> None:
        if "first_batch" not in self.points:
            self.synchronize()
            self.profile.disable()
            self.mark("first_batch")
        self.batches_in_epoch += 1
        if self.batches_in_epoch == run.batches_per_epoch:
            self.synchronize()
            self.last_batch_ends.append(self.now())  # the epoch's batches done: validation next
            if len(self.last_batch_ends) == 2 and self.profiling:
                self.end_profile.enable()
        if len(self.phases) == self.phase_batches:
            run.phases.reset()  # those batches only
            self.phase_batches = 0
        elif self.phase_batches:
            self.phases.append({})

    def on_val_end(self, run, result) -> None:
        """A validation ends (after the epoch's last batch, before the epoch's end)."""
        self.validations.append(self.now())

    def on_train_end(self, run) -> None:
        iterator = getattr(self.loader, "_iterator", None)  # persistent workers
        self.workers = [w.pid for w in getattr(iterator, "_workers", [])]
        self.workers_mib = _memory_mib(self.workers)

    def on_epoch_end(self, run, row) -> None:
        self.synchronize()
        self.epoch_ends.append(self.now())
        self.mark("epoch1")


def _memory_mib(pids: list[int]) -> dict[str, float] | None:
    """The processes' private and proportional memory, summed, in MiB (Linux)."""
    totals = {"private": 0, "pss": 0}
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            return None
        fields = dict(line.split(":", 1) for line in rollup.splitlines()[1:])
        kib = {name: int(value.split()[0]) for name, value in fields.items()}
        totals["private"] += kib["Private_Clean"] + kib["Private_Dirty"]
        totals["pss"] += kib["Pss"]
    return {name: round(value / 1024, 1) for name, value in totals.items()}


def child(args) -> None:
    if args.start_method:
        import multiprocessing

        multiprocessing.set_start_method(args.start_method)
    origin = args.spawned
    timeline_start = SPAWNED - origin
    import logging

    from collector_log import CollectorLog  # tools/ is on the path

    collections = CollectorLog(origin, clock=time.time).start()  # before torch's import
    imports = _FirstImports(origin)
    sys.meta_path.insert(0, imports)
    from falconet.cli import load_plugins  # as the falconet command loads them

    plugins = load_plugins()
    import torch

    from falconet.training.planning import plan_run
    from falconet.training.trainer import Trainer

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else lambda: None
    timeline = _Timeline(origin, sync, args.phase_batches, args.profile)
    timeline.points["python"] = round(timeline_start, 3)
    timeline.mark("imports")
    fill = _FillBreakdown(sync)
    if args.fill_breakdown:
        fill.install()

    class _Stamp(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            timeline.log.append((timeline.now(), record.getMessage()[:120]))

    logging.getLogger("falconet").addHandler(_Stamp())
    logging.getLogger("falconet").setLevel(logging.INFO)
    keys = dict(
        data=args.data,
        model=args.model,
        epochs=args.epochs,
        batch=args.batch,
        imgsz=args.imgsz,
        workers=args.workers,
        cache="ram",
        val=False,
        plots=False,
        project=args.tmp,
        name="run",
    )
    keys.update(pair.split("=", 1) for pair in args.child.split(":") if pair)
    plan = plan_run(keys, plugins)
    timeline.mark("plan")
    import faulthandler

    # on SIGUSR1 a process dumps its threads' stacks; the loader's workers inherit it
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    building = cProfile.Profile()
    if args.profile:
        building.enable()
    trainer = Trainer(plan, plugins, [timeline])
    building.disable()
    timeline.mark("trainer")
    timeline.loader = trainer.run.train_loader
    trainer.fit()
    timeline.mark("fit")
    ends = [timeline.points["fit_start"], *timeline.epoch_ends]
    result = {
        "points": {k: timeline.points[k] for k in POINTS if k in timeline.points},
        "epoch_s": [round(b - a, 3) for a, b in itertools.pairwise(ends)],
        "first_batches_phases_s": timeline.phases,
        "graph": trainer.run.graph,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "log": timeline.log,
        "first_imports": imports.found(),
        "imports_off_main": imports.off_main,
        "fill_breakdown_s": fill.result(),
        # the garbage collections until the first batch's end, and until the exit's start
        "collections_to_first_batch": collections.summary(timeline.points.get("first_batch")),
        "collections_to_fit_end": collections.summary(timeline.points.get("fit")),
        "epoch_end_s": [  # from an epoch's last batch (synchronized) to the next one's start
            round(start - end, 3)
            for end, start in zip(timeline.last_batch_ends, timeline.epoch_starts[1:], strict=False)
        ],
        "val_s": [  # each validation: from the epoch's last batch to the validation's end
            round(end - start, 3)
            for start, end in zip(timeline.last_batch_ends, timeline.validations, strict=False)
        ],
        "profiles": {
            "trainer": _top(building),
            "first_batch": _top(timeline.profile),
            "epoch_end": _top(timeline.end_profile) if timeline.end_profiled else None,
        }
        if args.profile
        else {},
    }
    workers = timeline.workers
    result["workers_mib"] = timeline.workers_mib
    result["workers_alive_after_fit"] = sum(map(_alive, workers))
    # what the exit waits for, if it waits: every thread's stack, once, on stderr
    faulthandler.dump_traceback_later(args.stacks_after, exit=False)
    threading.Thread(
        target=_probe_workers, args=(workers, args.stacks_after + 0.5), daemon=True
    ).start()
    print(MARK + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- parent
def measure(args, arm: str, tmp: Path) -> dict:
    """One training run of ``arm`` in a fresh process, its milestones and its exit."""
    spawned = time.time()
    command = [sys.executable, __file__, "--child", arm, "--spawned", repr(spawned)]
    options = ("data", "model", "epochs", "batch", "imgsz", "workers", "stacks_after")
    for option in (*options, "phase_batches"):
        command += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
    command += ["--start-method", args.start_method] if args.start_method else []
    command += ["--profile"] if args.profile else []
    command += ["--fill-breakdown"] if args.fill_breakdown else []
    command += ["--tmp", str(tmp)]
    stderr_path = tmp / f"stderr-{spawned:.0f}.txt"
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
        result: dict = {"arm": arm}
        for line in process.stdout:
            if line.startswith(MARK):
                result.update(json.loads(line[len(MARK) :]))
        try:
            code = process.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            code = "killed"
    gone = round(time.time() - spawned, 3)
    text = stderr_path.read_text()
    if "points" not in result:
        result["error"] = " | ".join(text.strip().splitlines()[-3:]) or f"exit {code}"
        return result
    result["points"]["exit"] = gone
    result["returncode"] = code
    dump = text.find("Thread 0x")  # faulthandler's dump starts with the first thread's line
    result["exit_stacks"] = text[dump : dump + 30000] if dump >= 0 else None
    return result


def report(results: list[dict], arms: list[str]) -> str:
    """Medians per arm: the seconds between consecutive milestones."""
    lines = [
        "| arm | " + " | ".join(POINTS) + " | runs |",
        "| --- | " + " | ".join("---" for _ in POINTS) + " | --- |",
    ]
    for arm in arms:
        runs = [r["points"] for r in results if r["arm"] == arm and "points" in r]
        cells = []
        for i, point in enumerate(POINTS):
            before = POINTS[i - 1] if i else None
            spans = [p[point] - (p[before] if before else 0.0) for p in runs if point in p]
            cells.append(f"{statistics.median(spans):.2f}" if spans else "-")
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {len(runs)} |")
    return "\n".join(lines) + "\n(seconds from the previous milestone; python: from the spawn)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../.data/coco128/coco128.yaml")
    parser.add_argument("--model", default="yolo-n")
    parser.add_argument("--arms", default="graph=whole-step:amp_dtype=fp16")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--stacks-after", type=float, default=5.0)
    parser.add_argument("--phase-batches", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the construction, the first batch and an epoch's end (slows them)",
    )
    parser.add_argument(
        "--fill-breakdown",
        action="store_true",
        help="time the cache=gpu fill's parts, synchronized (serialises them)",
    )
    parser.add_argument(
        "--start-method",
        choices=("fork", "forkserver", "spawn"),
        help="the child's default start method for processes (Python 3.14's is forkserver)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args)
        return
    arms = args.arms.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    results: list[dict] = []
    for repeat in range(args.repeats):
        for arm in arms if repeat % 2 == 0 else arms[::-1]:
            results.append(measure(args, arm, tmp))
            print(json.dumps({k: results[-1].get(k) for k in ("arm", "points", "error")}))
            if args.out:
                payload = {"settings": vars(args) | {"out": str(args.out)}, "results": results}
                args.out.write_text(json.dumps(payload, indent=1, default=str))
    print(report(results, arms))


if __name__ == "__main__":
    main()
