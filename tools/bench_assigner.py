"""The task-aligned assigner at real batch shapes: per slot (``[B, M, A]``, ``M`` the padded
largest box count) against per box (``[N, A]``, ``N`` the padded total, the ``box_rows`` of
``falconet.data.targets``), with the outputs compared bit for bit.

Most of the assigner's work is elementwise, and with mosaic a batch's largest box count is
several times its mean, so most of ``[B, M]`` is padding. This script measured what working
on the real boxes saves before the product took it (docs/performance.md), and measures it
again: batches come from the trainer's own loader (COCO128, mosaic, ``--batch``),
predictions from the untrained network's forward pass, and the assigner's inputs are taken
from the YOLO loss as it calls the assigner. On a GPU each form is recorded as a CUDA graph
and replayed (no launch cost, as in whole-step), median of ``--repeats``; on the CPU, wall
time.

    python tools/bench_assigner.py --data .data/coco128/coco128.yaml --batch 16,64 --out a.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from bench_train import median_ms  # tools/ is on the path
from check_graphs import build, fetch_batches
from graph_replay import replay_ms

from falconet.data.targets import TARGET_KEYS
from falconet_detect.assigners.tal import TaskAlignedAssigner


class Capture:
    """Stands in for the loss's assigner once, to keep the arguments the loss passes it."""

    def __init__(self, assigner) -> None:
        self.assigner, self.args, self.kwargs = assigner, None, None

    def __call__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        return self.assigner(*args, **kwargs)


def assigner_inputs(trainer, batch: dict) -> tuple:
    device = trainer.device
    images = batch["images"].to(device).float().div_(255)
    targets = {k: batch[k].to(device) for k in TARGET_KEYS}
    capture = Capture(trainer.loss_fn.assigner)
    trainer.loss_fn.assigner = capture
    try:
        with torch.no_grad(), trainer.precision.autocast(device):
            trainer.loss_fn(trainer.model(images), targets)
    finally:
        trainer.loss_fn.assigner = capture.assigner
    return capture.args, capture.kwargs["box_rows"]


def time_ms(fn, device: torch.device, repeats: int) -> float:
    """Replayed as a CUDA graph on a GPU (no launch cost), the host clock on the CPU."""
    return replay_ms(fn, 5, repeats) if device.type == "cuda" else median_ms(fn, 1, repeats)


def same(a, b) -> bool:
    """Every field of two assignments bit for bit (NaN nowhere here: predictions are finite)."""
    fields = ("labels", "boxes", "scores", "foreground")
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields)


def measure(args, batch_size: int, tmp: Path) -> dict:
    cuda = torch.cuda.is_available()
    keys = dict(
        data=args.data, imgsz=args.imgsz, batch=batch_size, workers=2, cache="ram",
        amp_dtype="bf16" if cuda else "fp32", val=False, plots=False, epochs=1,
        project=str(tmp), exist_ok=True, name=f"assigner-b{batch_size}", graph="eager",
    )  # fmt: skip
    trainer = build(keys)
    tal = TaskAlignedAssigner()
    rows, worst = [], None
    for batch in fetch_batches(trainer, args.batches):
        inputs, box_rows = assigner_inputs(trainer, batch)
        gt_boxes = inputs[3]
        equal = same(tal(*inputs), tal(*inputs, box_rows=box_rows))
        row = {"M": gt_boxes.shape[1], "boxes": int(batch["counts"].sum()), "N": len(box_rows[0])}
        rows.append(row | {"equal": equal})
        if worst is None or row["M"] * batch_size > worst[0]:
            worst = (row["M"] * batch_size, inputs, box_rows, row)
    _, inputs, box_rows, row = worst
    per_slot = time_ms(lambda: tal(*inputs), trainer.device, args.repeats)
    per_box = time_ms(lambda: tal(*inputs, box_rows=box_rows), trainer.device, args.repeats)
    return {
        "batches": rows,
        "all_equal": all(r["equal"] for r in rows),
        "timed_batch": row,
        "per_slot_ms": per_slot,
        "per_box_ms": per_box,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=".data/coco128/coco128.yaml")
    parser.add_argument("--batch", default="16,64")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batches", type=int, default=6, help="batches compared per size")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = {"torch": torch.__version__, "cuda": torch.cuda.is_available(), "sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for size in map(int, args.batch.split(",")):
            report["sizes"][size] = measure(args, size, Path(tmp))
            print(size, json.dumps(report["sizes"][size]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
