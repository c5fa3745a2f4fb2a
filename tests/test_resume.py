"""Exact resume: a run killed with SIGKILL and resumed ends bit-identical to one never killed."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from falconet.training.checkpoint import load_checkpoint
from falconet_testing.checkpoints import assert_same_tensors

EPOCHS = 3
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # two runs share the machine's cores at once


def _start(keys: dict[str, str], name: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FALCONET_")} | ONE_THREAD
    args = [f"{k}={v}" for k, v in keys.items()] + [f"name={name}", f"epochs={EPOCHS}"]
    return subprocess.Popen(
        [sys.executable, "-m", "falconet", "train", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _metrics(run: Path) -> list[tuple[str, ...]]:
    with (run / "results.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    keep = [k for k in rows[0] if k not in ("epoch_time", "img/s")]
    return [tuple(row[k] for k in keep) for row in rows]


def test_sigkill_mid_epoch_then_resume_is_bit_identical(tiny_run, tmp_path, falconet_cli):
    """Every entry of the resumed run's last.pt equals the uninterrupted run's: weights, EMA,
    optimizer state, counters and the saved RNG states (torch, NumPy, Python)."""
    keys = {**tiny_run, "seed": "3", "nbs": tiny_run["batch"]}  # an optimizer step per batch
    whole = _start(keys, "whole")
    killed = _start(keys, "killed")
    runs = tmp_path / "runs"
    last = runs / "killed" / "weights" / "last.pt"
    # last.pt is written in the background while the next epoch trains, so from the moment
    # it appears the process is inside the epoch after the one it holds
    _wait_for(last, killed)
    time.sleep(0.3)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL
    assert whole.wait() == 0, whole.stderr.read()

    at_kill = load_checkpoint(last)
    assert at_kill["epoch"] < EPOCHS, "the run finished before it was killed"
    resumed = falconet_cli("train", f"resume={last}", env=ONE_THREAD)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    assert "best epoch" in resumed.stdout and "AP50-95" in resumed.stdout  # the final table

    a = load_checkpoint(runs / "whole" / "weights" / "last.pt")
    b = load_checkpoint(last)
    assert a.keys() == b.keys()
    for part in a.keys() - {"config"}:
        assert_same_tensors(a[part], b[part], part)
    # the keys the two runs were started with differ only in the run's name and the resume
    started = ("name", "resume")
    assert_same_tensors(
        {k: v for k, v in a["config"].items() if k not in started},
        {k: v for k, v in b["config"].items() if k not in started},
        "config",
    )
    assert _metrics(runs / "whole") == _metrics(runs / "killed")

    # the optimizer really stepped after the resume: a step per batch, the weights moved
    assert b["step"] == EPOCHS * 3 > at_kill["step"]  # 24 images in batches of 8
    floats = [k for k, v in b["model"].items() if v.is_floating_point()]
    moved = [k for k in floats if not torch.equal(b["model"][k], at_kill["model"][k])]
    assert len(moved) > 0.9 * len(floats), f"{len(moved)} of {len(floats)} tensors moved"
    assert b["optimizer"]["state"], "the optimizer holds no state"


def test_resume_refuses_keys_that_change_the_run(falconet_cli, tiny_run, tmp_path):
    done = falconet_cli("train", *[f"{k}={v}" for k, v in tiny_run.items()], "epochs=1")
    assert done.returncode == 0, done.stderr
    last = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    refused = falconet_cli("train", f"resume={last}", "lr0=0.1")
    assert refused.returncode == 2
    assert "remove lr0" in refused.stderr
    best = falconet_cli("train", f"resume={last.with_name('best.pt')}")
    assert best.returncode == 2 and "holds weights only" in best.stderr
