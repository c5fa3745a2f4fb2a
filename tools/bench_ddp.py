"""Distributed training measured: scaling from 1 to N GPUs, the overfit check at 1 and N, and
a killed rank (docs/distributed.md).

    python tools/bench_ddp.py --data .data/coco128 --gpus 2 --batches 16,64 \\
        --arms graph=auto,graph=eager --out ddp.json

For each world size (1, and ``--gpus`` when above 1), per-GPU batch and arm, one run of
``torchrun --nproc-per-node W -m falconet train`` on COCO128 repeated ``--repeat-data`` times
(the global batch is ``W x`` the per-GPU batch; validation and plots off, ``cache=ram``). Its
end-to-end images/s is the global images of an epoch over that epoch's wall time from
``results.csv``, the median of the epochs after the first (which holds start-up and graph
capture); the scaling efficiency is ``img/s(W) / (W x img/s(1))``. ``--overfit-epochs N``
adds the overfit check (COCO128 with train = val, global batch ``--overfit-batch``) at each
world size, and ``--kill`` (world sizes above 1) kills rank 1 with SIGKILL one epoch in and
records how long the job took to end and what torchrun said. On one GPU only the world size 1
half runs, which checks the script and gives the baseline. Raw results go to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import repeated_dataset


def torchrun(world: int, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(world),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "-m",
        "falconet",
        "train",
    ]


def rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "results.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def e2e(args, world: int, batch: int, arm: dict[str, str], port: int, tmp: Path) -> dict:
    """One run's end-to-end figures."""
    name = f"w{world}-b{batch}-" + "-".join(f"{k}{v}" for k, v in arm.items())
    keys = {
        "data": str(args.data_yaml),
        "epochs": args.epochs,
        "batch": batch * world,
        "imgsz": args.imgsz,
        "workers": args.workers,
        "cache": "ram",
        "val": "false",
        "plots": "false",
        "close_mosaic": 0,
        "deterministic": "false",
        "project": str(tmp / "runs"),
        "name": name,
        **arm,
    }
    start = time.perf_counter()
    done = subprocess.run(
        [*torchrun(world, port), *(f"{k}={v}" for k, v in keys.items())],
        capture_output=True,
        text=True,
        timeout=args.timeout,
        check=False,
    )
    result = {"world": world, "batch_per_gpu": batch, "arm": arm, "rc": done.returncode}
    result["process_s"] = round(time.perf_counter() - start, 1)
    if done.returncode != 0:
        result["error"] = done.stderr[-2000:]
        return result
    run_dir = tmp / "runs" / name
    epochs = rows(run_dir)
    images = args.train_images
    rates = [images / float(r["epoch_time"]) for r in epochs[1:]] or [0.0]
    result["img_s"] = round(statistics.median(rates), 1)
    result["img_s_epochs"] = [round(r, 1) for r in rates]
    result["graph"] = next(
        (
            line.split("graph=")[1].split(",")[0]
            for line in done.stderr.splitlines()
            if line.startswith("run ") and "graph=" in line
        ),
        "?",
    )
    result["loss_last_epoch"] = {k: v for k, v in epochs[-1].items() if k.startswith("train/")}
    return result


def overfit(args, world: int, port: int, tmp: Path) -> dict:
    name = f"overfit-w{world}"
    keys = {
        "data": str(args.data_yaml.with_name("overfit.yaml")),
        "epochs": args.overfit_epochs,
        "batch": args.overfit_batch,
        "val_interval": args.overfit_epochs,
        "workers": args.workers,
        "cache": "ram",
        "plots": "false",
        "project": str(tmp / "runs"),
        "name": name,
    }
    done = subprocess.run(
        [*torchrun(world, port), *(f"{k}={v}" for k, v in keys.items())],
        capture_output=True,
        text=True,
        timeout=args.timeout * 4,
        check=False,
    )
    result = {"world": world, "global_batch": args.overfit_batch, "rc": done.returncode}
    if done.returncode == 0:
        last = rows(tmp / "runs" / name)[-1]
        result["map50_95"] = float(last["metrics/mAP50-95"])
        result["map50"] = float(last["metrics/mAP50"])
        result["loss_curve"] = [
            {k: r[k] for k in r if k.startswith("train/")} for r in rows(tmp / "runs" / name)
        ]
    else:
        result["error"] = done.stderr[-2000:]
    return result


def kill_rank(args, world: int, port: int, tmp: Path) -> dict:
    """SIGKILL to rank 1 one epoch in: how long the job takes to end, and what it said."""
    name = f"kill-w{world}"
    keys = {
        "data": str(args.data_yaml),
        "epochs": 50,
        "batch": 16 * world,
        "val": "false",
        "plots": "false",
        "workers": args.workers,
        "project": str(tmp / "runs"),
        "name": name,
    }
    job = subprocess.Popen(
        [*torchrun(world, port), *(f"{k}={v}" for k, v in keys.items())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    csv_path = tmp / "runs" / name / "results.csv"
    deadline = time.monotonic() + args.timeout
    while not csv_path.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    victim = None
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if parent == job.pid and b"RANK=1" in environ:
                victim = int(entry.name)
    if victim is None:
        job.kill()
        return {"world": world, "error": "rank 1 not found"}
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    try:
        _, stderr = job.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        job.kill()
        return {"world": world, "ended": False, "waited_s": 120}
    return {
        "world": world,
        "ended": True,
        "end_s": round(time.monotonic() - killed, 2),
        "rc": job.returncode,
        "report": [line for line in stderr.splitlines() if "rank" in line or "exitcode" in line][
            -6:
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(".data/coco128"))
    parser.add_argument("--gpus", type=int, default=2, help="the largest world size")
    parser.add_argument("--batches", default="16,64", help="images per GPU")
    parser.add_argument(
        "--arms", default="graph=auto,graph=eager", help="arms , between, keys : between"
    )
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeat-data", type=int, default=4)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--overfit-epochs", type=int, default=0, help="0: no overfit check")
    parser.add_argument("--overfit-batch", type=int, default=32, help="its global batch")
    parser.add_argument("--kill", action="store_true", help="kill rank 1 (world size > 1)")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--out", type=Path, default=Path("ddp.json"))
    args = parser.parse_args()
    import torch

    visible = torch.cuda.device_count()
    worlds = sorted({1, min(args.gpus, max(visible, 1))})
    arms = [dict(pair.split("=", 1) for pair in arm.split(":")) for arm in args.arms.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-ddp-"))
    args.data_yaml = repeated_dataset(args.data, args.repeat_data, tmp / "data")
    args.train_images = len(list((tmp / "data" / "images" / "train").iterdir()))
    doc = {"settings": {k: str(v) for k, v in vars(args).items()}, "worlds": worlds}
    doc["gpu"] = torch.cuda.get_device_name(0) if visible else "cpu"
    doc["versions"] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    port = 29600
    doc["e2e"] = []
    for batch in map(int, args.batches.split(",")):
        for arm in arms:
            for world in worlds:
                port += 1
                doc["e2e"].append(e2e(args, world, batch, arm, port, tmp))
                print(json.dumps(doc["e2e"][-1]), flush=True)
    for row in doc["e2e"]:
        base = next(
            (
                r
                for r in doc["e2e"]
                if r["world"] == 1
                and r["batch_per_gpu"] == row["batch_per_gpu"]
                and r["arm"] == row["arm"]
                and r.get("img_s")
            ),
            None,
        )
        if base and row.get("img_s"):
            row["scaling"] = round(row["img_s"] / (row["world"] * base["img_s"]), 3)
    if args.overfit_epochs:
        doc["overfit"] = [overfit(args, w, port + 10 + w, tmp) for w in worlds]
    if args.kill and max(worlds) > 1:
        doc["kill"] = kill_rank(args, max(worlds), port + 20, tmp)
    args.out.write_text(json.dumps(doc, indent=1))
    print("| world | batch/GPU | arm | graph | img/s | scaling |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in doc["e2e"]:
        arm = ",".join(f"{k}={v}" for k, v in row["arm"].items())
        print(
            f"| {row['world']} | {row['batch_per_gpu']} | {arm} | {row.get('graph', '-')} | "
            f"{row.get('img_s', row.get('error', '-')[:40])} | {row.get('scaling', '-')} |"
        )


if __name__ == "__main__":
    main()
