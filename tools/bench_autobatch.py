"""Autobatch measured on a GPU: the batch it picks, how long it takes, and whether the run then
stays inside the memory it was given (docs/training.md, "Batch size").

    python tools/bench_autobatch.py --data .data/coco128 --arms "batch=-1;batch=0.5" \\
        --graphs auto,eager --epochs 2 --out autobatch.json

Each arm is one run of yolo-n in a fresh process (``--worker``) on COCO128 repeated
``--repeat-data`` times (val is the original 128, validated every epoch): the probe's log line
(chosen batch, what it measured, its seconds), the run's own peak of reserved memory after
the probe (the peak statistics are reset when training starts, so the probe's own peak is not
counted) and what it still reserves at each epoch's end, the budget the probe worked to, and
whether the run ended without running out of memory. ``peak_within_budget`` is the check: the
run's peak is at most the budget. An arm with a fixed batch (``batch=64``) measures the run's
memory alone. Raw results go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import repeated_dataset

LINE = re.compile(
    r"autobatch: (?P<batch>\d+) images per GPU \(peak (?P<peak>[\d.]+) GiB of a "
    r"(?P<budget>[\d.]+) GiB budget.* in (?P<seconds>[\d.]+) s; measured (?P<tried>.*)"
)


class Watch:
    """Resets the peak memory statistics when training starts; the run's peak so far and its
    reserved memory at each epoch's end."""

    def __init__(self) -> None:
        self.peaks: list[float] = []
        self.held: list[float] = []  # reserved at each epoch's end: what the run keeps

    def on_train_start(self, run) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(run.device)

    def on_epoch_end(self, run, row) -> None:
        import torch

        self.peaks.append(torch.cuda.max_memory_reserved(run.device) / 2**30)
        self.held.append(torch.cuda.memory_reserved(run.device) / 2**30)


def worker(args) -> None:
    import torch

    from falconet.plugins import get_plugins
    from falconet.training.planning import plan_run
    from falconet.training.trainer import Trainer

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logging.getLogger("falconet.train").addHandler(Keep())
    logging.getLogger("falconet").setLevel(logging.INFO)
    keys = dict(
        data=str(args.data_yaml),
        model="yolo-n",
        epochs=args.epochs,
        cache="ram",
        workers=8,
        plots=False,
        project=str(args.project),
        name=args.arm.replace("=", "-"),
        graph=args.graph,
        **dict(pair.split("=", 1) for pair in args.arm.split(",")),
    )
    plugins = get_plugins()
    start = time.perf_counter()
    out: dict = {"arm": args.arm, "graph": args.graph}
    try:
        watch = Watch()
        trainer = Trainer(plan_run(keys, plugins), plugins, [watch])
        out["built_s"] = round(time.perf_counter() - start, 2)
        out["graph_used"] = trainer.run.graph
        trainer.fit()
        out["ended"] = "ok"
        out["run_peak_gib"] = round(max(watch.peaks), 2)
        out["epoch_peaks_gib"] = [round(p, 2) for p in watch.peaks]
        out["epoch_end_reserved_gib"] = [round(p, 2) for p in watch.held]
    except torch.OutOfMemoryError as error:
        out["ended"] = f"out of memory: {str(error).splitlines()[0]}"
    out["wall_s"] = round(time.perf_counter() - start, 2)
    found = [m for line in lines if (m := LINE.search(line))]
    if found:
        m = found[0]
        out |= {
            "batch": int(m["batch"]),
            "probe_peak_gib": float(m["peak"]),
            "budget_gib": float(m["budget"]),
            "autobatch_s": float(m["seconds"]),
            "measured": m["tried"],
        }
        if "run_peak_gib" in out:
            out["peak_within_budget"] = out["run_peak_gib"] <= out["budget_gib"]
    out["gpu"] = torch.cuda.get_device_name()
    out["torch"] = torch.__version__
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(".data/coco128"))
    parser.add_argument("--arms", default="batch=-1;batch=0.5", help="arms, ; between")
    parser.add_argument("--graphs", default="auto,eager")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeat-data", type=int, default=4)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--arm", default="", help=argparse.SUPPRESS)
    parser.add_argument("--graph", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--data-yaml", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--project", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-autobatch-"))
    data_yaml = repeated_dataset(args.data, args.repeat_data, tmp / "data")
    results = []
    for graph in args.graphs.split(","):
        for arm in args.arms.split(";"):
            command = [sys.executable, __file__, "--worker", "--arm", arm, "--graph", graph]
            command += ["--data-yaml", str(data_yaml), "--project", str(tmp / "runs")]
            command += ["--epochs", str(args.epochs)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            rows = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            result = json.loads(rows[-1][7:]) if rows else {"arm": arm, "graph": graph}
            result["returncode"] = done.returncode
            if done.returncode:
                result["stderr_tail"] = done.stderr[-2000:]
            print(json.dumps(result), flush=True)
            results.append(result)
            if args.out:
                args.out.write_text(json.dumps({"results": results}, indent=1))


if __name__ == "__main__":
    main()
