"""What the replay benchmarks of a trainer's parts share (``bench_update.py``,
``bench_checkpoint.py``, ``kernel_origins.py``): their command-line options, a trainer built as
``train`` builds it with the first batch of its loader on the device (for every precision and
batch size asked), and the results file's head."""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from falconet.data.loader import stop_workers
from falconet.data.targets import Targets
from falconet.plugins import get_plugins
from falconet.training.planning import plan_run
from falconet.training.trainer import Trainer


def replay_parser(doc: str) -> argparse.ArgumentParser:
    """Options for data, model, batch sizes, precisions and the replay timing."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--data", default="../.data/coco128/coco128.yaml")
    parser.add_argument("--model", default="yolo-n")
    parser.add_argument("--batch", default="16")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--amp", default="fp16,bf16")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    return parser


def trainer_and_batch(args, amp: str, batch_size: int, tmp: Path, name: str, **keys):
    """A trainer for ``args`` in ``amp`` at ``batch_size`` (its model in training mode), and
    its loader's first batch: images as float in [0, 1] and :class:`Targets`, on its device.
    The run's parts are ``trainer.run`` (``.step``, ``.parts``, ``.model``, ...). The trainer
    is eager unless ``keys`` say otherwise: the scripts time the network and loss
    themselves, and a graph backend's step would only sit beside them."""
    keys = {"graph": "eager", **keys}
    plugins = get_plugins()
    plan = plan_run(
        dict(
            data=args.data, model=args.model, imgsz=args.imgsz, batch=batch_size, workers=2,
            cache="ram", amp_dtype=amp, val=False, plots=False, epochs=1, project=str(tmp),
            exist_ok=True, name=f"{name}-{amp}-b{batch_size}", **keys,
        ),
        plugins,
    )  # fmt: skip
    trainer = Trainer(plan, plugins)
    run = trainer.run
    batch = next(iter(run.train_loader))
    stop_workers(run.train_loader)  # now, not at the interpreter's exit (stop_workers)
    images = batch["images"].to(run.device).float().div_(255)
    targets = Targets.from_batch(batch).to(run.device)
    run.model.train()
    return trainer, images, targets


def each_case(args, name: str, **keys) -> Iterator[tuple]:
    """``(amp, batch, trainer, images, targets)`` for every precision of ``--amp`` and batch
    size of ``--batch``, each trainer in a run folder of its own under one temporary one."""
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    for amp in args.amp.split(","):
        for batch_size in map(int, args.batch.split(",")):
            yield amp, batch_size, *trainer_and_batch(args, amp, batch_size, tmp, name, **keys)


def new_results() -> dict:
    """The results file's head: torch's version and the device the rows were timed on."""
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"torch": torch.__version__, "device": device, "rows": []}


def add_row(results: dict, row: dict) -> None:
    """One measured row: kept for the results file and printed as a JSON line."""
    results["rows"].append(row)
    print(json.dumps(row), flush=True)


def save_results(args, results: dict) -> None:
    """The results file, when ``--out`` was given."""
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
