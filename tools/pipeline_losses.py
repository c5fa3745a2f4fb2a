"""Do ``cache=gpu``'s batches train as the CPU loader's? Both pipelines trained on the CPU.

    python tools/pipeline_losses.py --data .data/coco128 --seeds 0,1,2 --out losses.json

``cache=gpu`` plans each batch at once and renders it from an image store; the CPU loader
plans and renders one sample at a time with OpenCV. On the same plan their boxes are equal and
their pixels equal up to interpolation rounding (``packages/core/tests/test_gpu_data.py``),
and their plans' statistics agree (``tools/plan_stats.py``); what neither shows is the
training: this script trains the same keys with both, for several seeds, and reports each
epoch's losses. The GPU loader runs here over a store filled on the CPU (``fill_store`` with a
CPU device; the trainer refuses ``cache=gpu`` off CUDA, which this script's child lifts, and
nothing else), rendering with the torch operations of ``falconet.data.gpu_augment``, the
reference the Triton kernel is tested against. What only a GPU runs (the kernel, nvJPEG, the
loader's stream and pinned copies) is not covered: ``tools/bench_train.py --measures e2e``
reports the last epoch's losses of each arm on the GPU.

Each run is a fresh process (``train`` as the CLI builds it: ``plan_run`` then
``Trainer.fit``), eager, fp32, ``deterministic=true``, the COCO128 train split repeated
``--repeat`` times (as ``bench_train.py``'s end-to-end runs), no validation. The runs
alternate between the pipelines (cpu gpu gpu cpu ...). Output: each run's rows, and per
pipeline the mean over seeds of each epoch's losses with their seed-to-seed spread.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LOSSES = ("train/box", "train/cls", "train/dfl")
MARK = "PIPELINE-LOSSES "


def child(args) -> None:
    """One training run of ``args.child`` (``cpu`` or ``gpu``), its rows printed as JSON."""
    import torch

    import falconet.training.assembly as assembly
    from falconet.data.gpu_cache import fill_store
    from falconet.plugins import get_plugins
    from falconet.training.loaders import train_samples
    from falconet.training.planning import plan_run
    from falconet.training.trainer import Trainer

    if args.child == "gpu":

        def store_on_the_cpu(cfg, dataset, device, world, memory=None):
            return fill_store(train_samples(cfg, dataset), cfg.imgsz, torch.device("cpu"))

        assembly.fill_gpu_cache = store_on_the_cpu  # the trainer's only refusal off CUDA

    class Rows:
        def __init__(self) -> None:
            self.rows: list[dict] = []

        def on_epoch_end(self, run, row) -> None:
            self.rows.append({k: row[k] for k in ("epoch", *LOSSES)})

    keys = dict(
        data=args.data_yaml,
        model=args.model,
        epochs=args.epochs,
        batch=args.batch,
        imgsz=args.imgsz,
        workers=args.workers,
        cache="gpu" if args.child == "gpu" else "ram",
        seed=args.seed,
        deterministic=True,
        amp_dtype="fp32",
        graph="eager",
        device="cpu",
        val=False,
        plots=False,
        project=args.tmp,
        name=f"{args.child}-{args.seed}",
    )
    plugins = get_plugins()
    rows = Rows()
    Trainer(plan_run(keys, plugins), plugins, [rows]).fit()
    print(MARK + json.dumps(rows.rows), flush=True)


def run(args, pipeline: str, seed: int, data_yaml: Path, tmp: Path) -> list[dict]:
    command = [sys.executable, __file__, "--child", pipeline, "--seed", str(seed)]
    command += ["--data-yaml", str(data_yaml), "--tmp", str(tmp)]
    for option in ("model", "epochs", "batch", "imgsz", "workers"):
        command += [f"--{option}", str(getattr(args, option))]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode or not lines:
        raise SystemExit(f"{pipeline} seed {seed} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(MARK) :])


def summary(runs: list[dict], epochs: int) -> dict:
    """Per pipeline and loss: each epoch's mean over the seeds, and its spread (max - min)."""
    out: dict = {}
    for pipeline in ("cpu", "gpu"):
        rows = [r["rows"] for r in runs if r["pipeline"] == pipeline]
        out[pipeline] = {
            loss: {
                "mean": [
                    round(statistics.fmean(seed_rows[e][loss] for seed_rows in rows), 4)
                    for e in range(epochs)
                ],
                "spread": [
                    round(
                        max(seed_rows[e][loss] for seed_rows in rows)
                        - min(seed_rows[e][loss] for seed_rows in rows),
                        4,
                    )
                    for e in range(epochs)
                ],
            }
            for loss in LOSSES
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(".data/coco128"), help="COCO128")
    parser.add_argument("--repeat", type=int, default=4, help="the train split this many times")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--model", default="yolo-n")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--imgsz", type=int, default=160)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", choices=("cpu", "gpu"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data-yaml", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    sys.path.insert(0, str(Path(__file__).parent))
    import torch
    from bench_train import repeated_dataset

    tmp = Path(tempfile.mkdtemp(prefix="pipeline-losses-"))
    data_yaml = repeated_dataset(args.data, args.repeat, tmp / "data")
    seeds = [int(s) for s in args.seeds.split(",")]
    order = ("cpu", "gpu")
    runs = []
    for i, seed in enumerate(seeds):
        for pipeline in order if i % 2 == 0 else order[::-1]:
            rows = run(args, pipeline, seed, data_yaml, tmp / "runs")
            runs.append({"pipeline": pipeline, "seed": seed, "rows": rows})
            last = rows[-1]
            print(pipeline, seed, " ".join(f"{k} {last[k]:.4f}" for k in LOSSES), flush=True)
    table = summary(runs, args.epochs)
    for pipeline, losses in table.items():
        print(
            pipeline,
            "last epoch, mean (spread) over seeds:",
            ", ".join(
                f"{k} {v['mean'][-1]:.4f} ({v['spread'][-1]:.4f})" for k, v in losses.items()
            ),
        )
    if args.out:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        record = {
            "settings": settings,
            "versions": {"python": platform.python_version(), "torch": torch.__version__},
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
            "summary": table,
            "runs": runs,
        }
        args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
