"""Train once and report how fast the run converged: wall time, the first epoch reaching a
target metric, the best metrics. The figures in docs/lab/2026-11-convergence-and-resume.md came
from this script.

    python tools/convergence.py --target mAP50=0.9 data=shapes            # the main job's run
    python tools/convergence.py --target mAP50-95=0.5 --json out.json \\
        data=coco128.yaml epochs=300 imgsz=640 cache=ram val_interval=5     # the GPU overfit

Keys after the options are ``falconet train`` keys. Prints one JSON document (and writes it
with ``--json``): the keys, hardware and versions, wall seconds, the epoch and seconds at which
the target was first met (from results.csv, whose ``epoch_time`` excludes validation), and the
best validation.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import platform
import time
from pathlib import Path

import torch

from falconet import Detector, __version__
from falconet.training.config import parse_cli_pairs

COLUMNS = {"mAP50": "metrics/mAP50", "mAP50-95": "metrics/mAP50-95"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--target", default="mAP50=0.9", help="METRIC=VALUE, METRIC in mAP50, mAP50-95"
    )
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("keys", nargs="*", help="falconet train keys (key=value)")
    args = parser.parse_args()
    metric, _, value = args.target.partition("=")
    if metric not in COLUMNS:
        parser.error(f"--target metric must be one of {', '.join(COLUMNS)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    keys = parse_cli_pairs(args.keys)
    start = time.perf_counter()
    summary = Detector(keys.pop("model", "yolo-n")).train(**keys)
    wall = time.perf_counter() - start
    with (Path(summary["run_dir"]) / "results.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    reached, train_seconds = None, 0.0
    for row in rows:
        train_seconds += float(row["epoch_time"])
        score = row.get(COLUMNS[metric], "")
        if score and float(score) >= float(value):
            reached = {"epoch": int(row["epoch"]), "train_seconds": round(train_seconds, 1)}
            break
    report = {
        "keys": args.keys,
        "target": args.target,
        "reached": reached,
        "wall_seconds": round(wall, 1),
        "epochs_run": summary["epochs"],
        "best_epoch": summary["best_epoch"],
        "best": {k: summary["metrics"].get(k) for k in ("AP", "AP50")},
        "last_row": rows[-1],
        "precision": summary["precision"],
        "graph": summary["graph"],
        "hardware": torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)",
        "versions": {
            "falconet": __version__,
            "torch": str(torch.__version__),
            "python": platform.python_version(),
        },
        "run_dir": summary["run_dir"],
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
