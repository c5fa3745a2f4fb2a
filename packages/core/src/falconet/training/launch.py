"""``device=0,1``: one training process per GPU, started by torchrun from a plain call.

``Detector.train(device="0,1")`` and ``falconet train device=0,1`` hand the run to
``torchrun --nproc-per-node 2 -m falconet train KEY=VALUE ...`` with ``CUDA_VISIBLE_DEVICES``
set to the list, so each rank takes ``cuda:LOCAL_RANK``, one of the listed GPUs. The workers
run falconet's own command with the caller's keys, never the caller's script: a script with no
``if __name__ == "__main__":`` guard is not imported again, and nothing but the keys crosses
into the workers (callbacks are named in ``callbacks=``, as registered ones). Rank 0 writes the
run's summary to a file the caller reads back; the caller's ``Detector`` then loads the run's
``best.pt`` as after any run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from falconet.training.config import ConfigError, format_value

SUMMARY_ENV = "FALCONET_SUMMARY_OUT"
"""Where rank 0 of a launched run writes its summary (JSON)."""


def gpu_list(spec: Any) -> list[int] | None:
    """The GPU indices of ``device=0,1`` or ``device=[0, 1]`` (``None`` for one device)."""
    if isinstance(spec, list | tuple):
        spec = ",".join(map(str, spec))
    entries = [part.strip() for part in str(spec).split(",") if part.strip()]
    if len(entries) < 2:
        return None
    indices = [e.removeprefix("cuda:") for e in entries]
    if not all(i.isdigit() for i in indices) or len(set(indices)) != len(indices):
        raise ConfigError(
            f"device={spec}: a list of distinct GPU indices (device=0,1) starts one process "
            "per GPU; for CPU processes launch torchrun yourself (docs/distributed.md)"
        )
    return [int(i) for i in indices]


def check_before_launch(keys: Mapping[str, Any], workers: int, plugins: Any) -> None:
    """Raise the keys' errors here, before any worker starts, as a run in this process would:
    an unknown key or bad value, callbacks given as objects (only names cross into the
    workers), a global batch that does not divide by the workers."""
    from falconet.training.autobatch import wanted_fraction
    from falconet.training.config import build_config, config_model
    from falconet.training.distributed import World, per_rank_batch

    config = build_config(config_model(plugins), {k: v for k, v in keys.items() if k != "device"})
    if wanted_fraction(config.batch) is None:
        per_rank_batch(int(config.batch), World(0, 0, workers))


def launch(
    keys: Mapping[str, Any], gpus: list[int] | None, processes: int | None = None
) -> dict[str, Any]:
    """Train ``keys`` on ``gpus``, one torchrun worker each (``gpus=None``: ``processes``
    CPU workers on Gloo); returns rank 0's summary.

    A worker that fails ends the job (torchrun stops the others); the error says which rank
    failed and how, from torchrun's report."""
    import torch

    if gpus is not None and (
        not torch.cuda.is_available() or max(gpus) >= torch.cuda.device_count()
    ):
        raise ConfigError(
            f"device={','.join(map(str, gpus))}: only {torch.cuda.device_count()} CUDA "
            "device(s) are visible here"
        )
    workers = len(gpus) if gpus is not None else processes
    pairs = [f"{k}={format_value(v)}" for k, v in keys.items() if k != "device"]
    pairs.append("device=auto" if gpus is not None else "device=cpu")
    with tempfile.TemporaryDirectory(prefix="falconet-launch-") as folder:
        summary = Path(folder) / "summary.json"
        env = {**os.environ, SUMMARY_ENV: str(summary)}
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(workers),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            "-m",
            "falconet",
            "train",
            *pairs,
        ]
        done = subprocess.run(command, env=env, stderr=subprocess.PIPE, text=True, check=False)
        if done.returncode != 0 or not summary.exists():
            sys.stderr.write(done.stderr)
            raise RuntimeError(
                f"the {workers}-process run failed (torchrun exit status {done.returncode}); "
                "its report above names the rank that failed and why"
            )
        return json.loads(summary.read_text())


def write_summary(summary: Mapping[str, Any]) -> None:
    """Rank 0's part of :func:`launch`: the summary, where the caller waits for it."""
    if path := os.environ.get(SUMMARY_ENV):
        Path(path).write_text(json.dumps(summary, default=str))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
