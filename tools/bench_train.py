"""Training speed side by side: falconet against Ultralytics and LibreYOLO, same data and GPU.

    python tools/bench_train.py --data .data/coco128 --arms falconet,ultralytics,libreyolo \\
        --batch 16,64 --repeats 3 --epochs 6 --repeat-data 4 --out bench.json

Every measurement runs in a fresh process (``--worker``), arms alternate within each repeat.
Per arm and batch size:

* **end to end**: images/s over epochs 2..N, from the wall time between consecutive epoch ends
  (each framework's own loop: loader, step, EMA, checkpoint; validation off), on COCO128
  repeated ``--repeat-data`` times (symlinks) so an epoch is long enough to be stable;
* **isolated step** (falconet, Ultralytics): forward + loss + backward + optimizer + EMA on
  one fixed batch, 20 warm-up steps, median of 100, CUDA events;
* **falconet only**: GPU-busy fraction (kernel time over step wall time, torch.profiler over
  20 steps), kernels per step and host syncs per step (``set_sync_debug_mode("warn")``).

Settings shared by every arm: 640 px, fp16 autocast (each framework's AMP), cache in RAM,
``--workers`` loader workers, mosaic throughout, from scratch, nothing downloaded. The peers
run offline as docs/benchmarks.md describes (environment set here). Prints a markdown table of
medians with the ratio to Ultralytics and writes every raw result to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
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
    # the accuracy check: COCO128 once, train = val (an overfit, as in docs/training.md)
    (folder / "overfit.yaml").write_text(
        f"path: {folder}\ntrain: images/val\nval: images/val\n{names}\n"
    )
    return yaml_path


# ------------------------------------------------------------------------ measurements
class EpochClock:
    """Wall-clock time of every epoch end (the same callback idea in every framework)."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def tick(self, *_args, **_kwargs) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())

    def throughput(self, images_per_epoch: int) -> float:
        """images/s over epochs 2..N (the first epoch, with its warm-up, is left out)."""
        span = self.ends[-1] - self.ends[0]
        return images_per_epoch * (len(self.ends) - 1) / span


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


def gpu_profile(step, steps: int = 20) -> dict:
    """GPU-busy fraction, kernels per step and host syncs per step of ``step``."""
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
    busy_us = sum(e.device_time for e in kernels)
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step()
        torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode(0)
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    return {
        "gpu_busy": round(busy_us / wall_us, 3),
        "kernels_per_step": round(len(kernels) / steps),
        "syncs_per_step": syncs,
    }


# ---------------------------------------------------------------------------- the arms
def run_falconet(args) -> dict:
    import torch

    from falconet.plugins import get_plugins
    from falconet.training.setup import plan_run
    from falconet.training.trainer import TARGET_KEYS, Trainer

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
        **args.arm_keys,
    )
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
        }
    if args.measure == "e2e":
        clock = EpochClock()
        trainer = Trainer(plan_run(keys, plugins), plugins, [SimpleCallback(clock)])
        images = len(trainer.train_loader.dataset)
        clock.tick()  # the start of epoch 1 counts as an end, so epoch 1 is left out below
        trainer.fit()
        clock.ends = clock.ends[1:]
        result["img_s"] = clock.throughput(images)
        result["loss_last_epoch"] = trainer.logged
    else:
        trainer = Trainer(plan_run({**keys, "epochs": 1}, plugins), plugins)
        batch = next(iter(trainer.train_loader))
        device = trainer.device
        images = batch["images"].to(device).float().div_(255)
        targets = {k: batch[k].to(device) for k in TARGET_KEYS}

        def step() -> None:
            trainer.train_batch(images, targets, optimizer_step=True)

        result["step_ms"] = median_ms(step, args.warmup, args.steps)
        if torch.cuda.is_available():
            result.update(gpu_profile(step))
    return result


class SimpleCallback:
    def __init__(self, clock: EpochClock) -> None:
        self.clock = clock

    def on_epoch_end(self, trainer, row) -> None:
        self.clock.tick()


def _offline_ultralytics(tmp: Path) -> None:
    """What Ultralytics needs to run without a network (docs/benchmarks.md)."""
    config = tmp / "ultralytics-config"
    config.mkdir(parents=True, exist_ok=True)
    os.environ.update(YOLO_OFFLINE="1", YOLO_AUTOINSTALL="0", YOLO_CONFIG_DIR=str(config))
    (config / "settings.json").write_text(json.dumps({"sync": False}))
    import matplotlib

    font = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    shutil.copy(font, config / "Arial.ttf")


def run_ultralytics(args) -> dict:
    _offline_ultralytics(Path(args.tmp))
    import torch
    from ultralytics.engine.trainer import BaseTrainer
    from ultralytics.models.yolo.detect import DetectionTrainer

    # its polars dependency (a 54 MB wheel) only reads results.csv back for checkpoints
    BaseTrainer.read_results_csv = lambda self: {}
    overrides = dict(
        model="yolo26n.yaml",
        data=str(args.data_yaml),
        epochs=args.epochs,
        batch=args.batch,
        imgsz=args.imgsz,
        workers=args.workers,
        cache="ram",
        amp=True,
        pretrained=False,
        plots=False,
        close_mosaic=0,
        deterministic=False,
        val=False,
        project=args.tmp,
        name="ultralytics",
        exist_ok=True,
        verbose=False,
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
        clock = EpochClock()
        trainer = DetectionTrainer(overrides=overrides)
        trainer.add_callback("on_train_start", lambda t: clock.tick())
        trainer.add_callback("on_train_epoch_end", lambda t: clock.tick())
        trainer.train()
        clock.ends = clock.ends[1:]
        images = len(trainer.train_loader.dataset)
        result["img_s"] = clock.throughput(images)
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

    clock = EpochClock()

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
    clock.ends = clock.ends[1:]
    return {"img_s": clock.throughput(128 * args.repeat_data)}


ARMS = {"falconet": run_falconet, "ultralytics": run_ultralytics, "libreyolo": run_libreyolo}


# ------------------------------------------------------------------------ orchestration
def worker(args) -> None:
    """One measurement; ``--worker`` is an arm, optionally with falconet keys after a colon
    (``falconet:optimizer=adamw,lr0=0.002``: the recipe closest to a peer's)."""
    result = {"arm": args.worker, "batch": args.batch, "measure": args.measure}
    name, _, extra = args.worker.partition(":")
    args.arm_keys = dict(pair.split("=", 1) for pair in extra.split(",") if pair)
    try:
        result.update(ARMS[name](args))
    except Exception as exc:  # one failed arm must not lose the others' numbers
        result["error"] = f"{type(exc).__name__}: {exc}"
    print(MARK + json.dumps(result, default=str), flush=True)


def spawn(args, arm: str, batch: int, measure: str, data_yaml: Path, tmp: Path) -> dict:
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
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {"arm": arm, "batch": batch, "measure": measure, "error": " | ".join(tail)}


def table(results: list[dict], arms: list[str], batches: list[int]) -> str:
    def median(arm, batch, measure, key):
        values = [
            r[key]
            for r in results
            if (r["arm"], r["batch"], r["measure"]) == (arm, batch, measure)
            and r.get(key) is not None
        ]
        return statistics.median(values) if values else None

    lines = [
        "| arm | batch | end-to-end img/s | vs Ultralytics | step ms | GPU busy | "
        "kernels/step | syncs/step | overfit mAP50-95 | overfit mAP50 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for batch in batches:
        base = median("ultralytics", batch, "e2e", "img_s")
        for arm in arms:
            e2e = median(arm, batch, "e2e", "img_s")
            cells = [
                "-" if e2e is None else f"{e2e:.0f}",
                f"{e2e / base:.2f}x" if e2e and base else "-",
            ]
            for measure, key in [
                ("step", "step_ms"),
                ("step", "gpu_busy"),
                ("step", "kernels_per_step"),
                ("step", "syncs_per_step"),
                ("overfit", "map50_95"),
                ("overfit", "map50"),
            ]:
                value = median(arm, batch, measure, key)
                cells.append("-" if value is None else f"{value:.3g}")
            lines.append(f"| {arm} | {batch} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(".data/coco128"))
    parser.add_argument("--arms", default="falconet,ultralytics,libreyolo")
    parser.add_argument("--batch", default="16,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--repeat-data", type=int, default=4)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--amp", default="fp16", help="falconet's amp_dtype (peers use fp16)")
    parser.add_argument("--measures", default="e2e,step,overfit")
    parser.add_argument(
        "--overfit-epochs", type=int, default=30, help="accuracy: epochs of the COCO128 overfit"
    )
    parser.add_argument("--warmup", type=int, default=20, help="isolated step: warm-up steps")
    parser.add_argument("--steps", type=int, default=100, help="isolated step: timed steps")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", type=Path)
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
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    data_yaml = repeated_dataset(args.data, args.repeat_data, tmp / "data")
    results = []
    for repeat in range(args.repeats):
        order = arms if repeat % 2 == 0 else arms[::-1]  # alternate the arms' order
        for batch in batches:
            for arm in order:
                for measure in args.measures.split(","):
                    if measure == "step" and arm.startswith("libreyolo"):
                        continue  # its step is not reachable from outside its trainer
                    result = spawn(args, arm, batch, measure, data_yaml, tmp)
                    result["repeat"] = repeat
                    print(json.dumps(result, default=str), file=sys.stderr, flush=True)
                    results.append(result)
    report = table(results, arms, batches)
    print(report)
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "settings": vars(args) | {"data": str(args.data), "out": str(args.out)},
                    "results": results,
                    "table": report,
                },
                indent=1,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
