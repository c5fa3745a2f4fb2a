"""The GPU's first use in a fresh process, part by part: where the start-up's copy spends its
seconds, and which parts could run beside the imports instead.

A run's start-up trains a copy of the network on one synthetic batch while the cache fills
(:mod:`falconet.training.first_use`): after the imports, the longest part of the start-up
(docs/lab/2026-12-cache-gpu-history.md, start-up). This script times, each in its own process
(one process per mode and repeat, so every figure is a first use):

- ``import_torch`` and ``import_falconet`` (the trainer's modules and the plugins);
- ``context``: the CUDA context and the network moved onto the device;
- ``libraries``: one small fp16 convolution forward and backward and one fp16 matrix product
  (cuDNN's and cuBLAS's libraries loaded and their handles made);
- ``copy``: the product's own first use (``first_use._train_a_copy``: yolo-n forward, loss and
  backward at the run's batch, cuDNN timing its choices), then ``again``: the same a second
  time, which has nothing left to load or time.

Modes, each a different order of the same parts:

- ``serial``: every part in turn on the main thread, as a run makes them;
- ``cold``: as ``serial`` without ``libraries``: their cost then lands in ``copy``;
- ``beside``: ``context`` and ``libraries`` on a thread started right after torch's import,
  while the main thread imports falconet and builds the network on the CPU (does the thread's
  work hide behind the imports, and does it slow them?);
- ``driver``: the CUDA context made through the driver API (``cuInit`` and the device's
  primary context, which the runtime then uses) on a thread started before torch's import.

Every figure is seconds; ``ends`` are seconds from the process's spawn. Nothing here changes
how a run starts: it measures which change would pay.

    python tools/bench_first_use.py --modes serial,cold,beside,driver --repeats 3 --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

SPAWNED = time.time()
HERE = Path(__file__).resolve().parent
MODES = ("serial", "cold", "beside", "driver")


def _driver_context(ordinal: int, seconds: dict) -> threading.Thread:
    """A thread that makes device ``ordinal``'s primary context through libcuda (no torch)."""

    def run() -> None:
        import ctypes

        start = time.perf_counter()
        cuda = ctypes.CDLL("libcuda.so.1")
        device, context = ctypes.c_int(), ctypes.c_void_p()
        for call in (
            lambda: cuda.cuInit(0),
            lambda: cuda.cuDeviceGet(ctypes.byref(device), ordinal),
            lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
        ):
            if (status := call()) != 0:
                seconds["driver_error"] = status
                break
        seconds["driver_thread"] = time.perf_counter() - start

    thread = threading.Thread(target=run, name="driver-context", daemon=True)
    thread.start()
    return thread


def child(args) -> dict:
    """One process's first use in the order of ``args.child``: each part's seconds, and the
    ends of the slow ones in seconds from the spawn."""
    seconds: dict = {}
    ends: dict = {"python": time.time() - args.spawned}
    early = _driver_context(0, seconds) if args.child == "driver" else None
    start = time.perf_counter()
    import torch

    seconds["import_torch"] = time.perf_counter() - start
    ends["import_torch"] = time.time() - args.spawned
    device = torch.device("cuda:0")

    def context_and_libraries(model) -> None:
        start = time.perf_counter()
        torch.empty(1, device=device)
        if model is not None:
            model.to(device, memory_format=torch.channels_last)
        torch.cuda.synchronize(device)
        seconds["context"] = time.perf_counter() - start
        if args.child == "cold":
            return
        start = time.perf_counter()
        conv = torch.nn.Conv2d(16, 16, 3, padding=1).to(device, memory_format=torch.channels_last)
        x = torch.randn(2, 16, 32, 32, device=device).contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.float16):
            y = conv(x.requires_grad_())
            z = torch.randn(64, 64, device=device) @ torch.randn(64, 64, device=device)
        (y.float().sum() + z.float().sum()).backward()
        torch.cuda.synchronize(device)
        seconds["libraries"] = time.perf_counter() - start

    beside = None
    if args.child == "beside":
        box: dict = {}

        def run() -> None:
            start = time.perf_counter()
            context_and_libraries(None)
            box["thread"] = time.perf_counter() - start

        beside = threading.Thread(target=run, name="context-beside", daemon=True)
        beside.start()
    start = time.perf_counter()
    from falconet.plugins import get_plugins
    from falconet.training.autobatch import box_count
    from falconet.training.backends import choose_precision
    from falconet.training.first_use import _train_a_copy
    from falconet.training.planning import plan_run
    from falconet.training.trainer import Trainer  # noqa: F401  (the run's imports)

    plugins = get_plugins()
    seconds["import_falconet"] = time.perf_counter() - start
    ends["import_falconet"] = time.time() - args.spawned
    start = time.perf_counter()
    keys = dict(data=args.data, model=args.model, batch=args.batch, imgsz=args.imgsz,
                amp_dtype="fp16", val=False, plots=False)  # fmt: skip
    plan = plan_run(keys, plugins)
    from falconet.contract import PrecisionContext

    context = PrecisionContext(device, plan.config.model_dump(), args.batch, args.imgsz, 1)
    precision = choose_precision("fp16", context, plugins)
    model = precision.wrap_model(plan.family.build_model(plan.model_name, 80))
    seconds["build_cpu"] = time.perf_counter() - start
    if beside is not None:
        start = time.perf_counter()
        beside.join()
        seconds["waited_for_thread"] = time.perf_counter() - start
        seconds["thread"] = box["thread"]
        start = time.perf_counter()
        model.to(device, memory_format=torch.channels_last)
        torch.cuda.synchronize(device)
        seconds["to_device"] = time.perf_counter() - start
    else:
        if early is not None:
            start = time.perf_counter()
            early.join()
            seconds["waited_for_thread"] = time.perf_counter() - start
        context_and_libraries(model)
    ends["before_copy"] = time.time() - args.spawned
    synthetic = (args.batch, args.imgsz, box_count(args.mean_boxes, 1.0), 80)

    def loss_for(network):
        return plan.family.build_loss(network, plugins.assigners.get(plan.config.assigner))

    for name in ("copy", "again"):
        took, error = _train_a_copy(model, loss_for, precision, synthetic, device)
        if error is not None:
            raise error
        seconds[name] = took
        ends[name] = time.time() - args.spawned
    return {
        "mode": args.child,
        "seconds": {k: round(v, 3) if isinstance(v, float) else v for k, v in seconds.items()},
        "ends": {k: round(v, 3) for k, v in ends.items()},
    }


def medians(runs: list[dict], modes: list[str]) -> dict[str, dict[str, float]]:
    """Per mode, over its processes that ran through: each part's median seconds,
    ``copy_end`` (the copy's end from the spawn) and ``after_torch`` (from torch's import to
    the copy's end: what the order of the parts changes, without the import's own spread).
    A mode none of whose processes ran through has none."""
    summary = {}
    for mode in modes:
        ok = [r for r in runs if r["mode"] == mode and "error" not in r]
        if not ok:
            summary[mode] = {}
            continue
        keys = sorted({k for r in ok for k in r["seconds"] if k != "driver_error"})
        summary[mode] = {
            k: statistics.median(r["seconds"][k] for r in ok if k in r["seconds"]) for k in keys
        } | {
            "copy_end": statistics.median(r["ends"]["copy"] for r in ok),
            "after_torch": statistics.median(
                r["ends"]["copy"] - r["ends"]["import_torch"] for r in ok
            ),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(HERE.parent / ".data/coco128/coco128.yaml"))
    parser.add_argument("--model", default="yolo-n")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument(
        "--mean-boxes",
        type=float,
        default=7.2,
        help="labels per image, for the synthetic batch's boxes (COCO128's)",
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    modes = [m for m in args.modes.split(",") if m]
    if unknown := sorted(set(modes) - set(MODES)):
        parser.error(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(MODES)}")
    runs: list[dict] = []
    for repeat in range(args.repeats):
        for mode in modes if repeat % 2 == 0 else modes[::-1]:  # interleaved, both orders
            sizes = ["--batch", str(args.batch), "--imgsz", str(args.imgsz)]
            command = [sys.executable, __file__, "--child", mode, "--spawned", str(time.time()),
                       "--data", args.data, "--model", args.model, *sizes,
                       "--mean-boxes", str(args.mean_boxes)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
            if done.returncode != 0:
                runs.append({"mode": mode, "error": done.stderr[-2000:]})
                print(f"{mode}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]))
    summary = medians(runs, modes)
    for mode in modes:
        print(mode, json.dumps(summary[mode]))
    import torch

    result = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("child", "spawned")},
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "medians": summary,
        "runs": runs,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
