"""The assigners at real batch shapes: the time of one assignment, and that padding a batch's
targets to a larger bucket changes no assignment. ``tal``, ``simota`` and ``hungarian`` (on
the GPU, its Triton solver) are static-shaped; ``hungarian_scipy`` is the same matching solved
by scipy on the host (one synchronisation), what the GPU solver replaced.

Batches come from the training dataset with the YOLO family's augmentation (COCO128, mosaic,
``--batch``), predictions from the untrained ``yolo-n``'s forward pass, and the assigner's
inputs, ``(Predictions, Targets)``, are taken from the YOLO loss as it calls the assigner.
``tal`` works on the ``N`` real boxes, ``simota`` on the ``B x M`` slots, so with mosaic
(most of ``[B, M]`` padding) their times differ by more than their rules
(docs/performance.md). On a GPU each static-shaped assigner is recorded as a CUDA graph and
replayed (no launch cost, as in whole-step), median of ``--repeats``; ``hungarian_scipy``
cannot be recorded and is timed as called, its host wait included (CUDA events around each
call); on the CPU, wall time, and both ``hungarian`` rows are scipy. The batch timed is the
one with the largest ``B x M``.

    python tools/bench_assigner.py --data .data/coco128/coco128.yaml --batch 16,64 --out a.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from bench_train import median_ms  # tools/ is on the path
from graph_replay import replay_ms

from falconet.data import load_dataset
from falconet.data.loader import DetectionDataset, collate
from falconet.data.targets import Targets
from falconet.data.transforms import AugmentConfig
from falconet_detect.assigners.hungarian import HungarianAssigner
from falconet_detect.assigners.simota import SimOTAAssigner
from falconet_detect.assigners.tal import TaskAlignedAssigner
from falconet_detect.family import YoloFamily

FIELDS = ("labels", "boxes", "scores", "foreground")


class Capture:
    """Stands in for the loss's assigner once, to keep what the loss passes it."""

    def __init__(self, assigner) -> None:
        self.assigner, self.inputs = assigner, None

    def __call__(self, predictions, targets):
        self.inputs = (predictions, targets)
        return self.assigner(predictions, targets)


def batches(args, batch_size: int) -> tuple[list[dict], int]:
    """``--batches`` augmented training batches of ``batch_size``, and the class count."""
    dataset = load_dataset(Path(args.data), splits=("train",))
    data = DetectionDataset(
        dataset.splits["train"].samples, args.imgsz, augment=AugmentConfig(), cache="ram"
    )
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0)).tolist()
    size = batch_size * args.batches
    picks = [order[i % len(order)] for i in range(size)]
    made = [
        collate([data[i] for i in picks[k : k + batch_size]]) for k in range(0, size, batch_size)
    ]
    return made, len(dataset.names)


def assigner_inputs(model, batch: dict, device: torch.device, dtype: torch.dtype) -> tuple:
    """``(Predictions, Targets)`` of ``batch`` as the YOLO loss hands them to its assigner."""
    images = batch["images"].to(device).float().div_(255)
    targets = Targets.from_batch(batch).to(device)
    capture = Capture(TaskAlignedAssigner())
    loss = YoloFamily().build_loss(model, capture)
    enabled = dtype != torch.float32
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=enabled):
        loss(model(images), targets)
    return capture.inputs


def time_ms(fn, device: torch.device, repeats: int, recorded: bool = True) -> float:
    """Replayed as a CUDA graph on a GPU (no launch cost) where ``recorded``, else each call
    between CUDA events (a host wait inside it counted); the host clock on the CPU."""
    if device.type == "cuda" and recorded:
        return replay_ms(fn, 5, repeats)
    return median_ms(fn, 1, repeats)


def same(a, b) -> bool:
    """Every field of two assignments bit for bit (NaN nowhere here: predictions are finite)."""
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def measure(args, batch_size: int) -> dict:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    data, classes = batches(args, batch_size)
    torch.manual_seed(0)
    model = (
        YoloFamily().build_model("yolo-n", classes).to(device, memory_format=torch.channels_last)
    )
    assigners = {
        "tal": TaskAlignedAssigner(),
        "simota": SimOTAAssigner(),
        "hungarian": HungarianAssigner(),
        "hungarian_scipy": HungarianAssigner(on_gpu=False),
    }
    rows, worst = [], None
    for batch in data:
        predictions, targets = assigner_inputs(model, batch, device, dtype)
        m, n = targets.bucket
        larger = targets.padded((2 * m, 2 * n))
        row = {"M": m, "N": n, "boxes": int(batch["counts"].sum())}
        for name, assigner in assigners.items():
            row[f"{name}_padding_changes_nothing"] = same(
                assigner(predictions, targets), assigner(predictions, larger)
            )
        rows.append(row)
        if worst is None or m * batch_size > worst[0]:
            worst = (m * batch_size, predictions, targets, row)
    _, predictions, targets, row = worst
    times = {
        f"{name}_ms": time_ms(
            lambda a=assigner: a(predictions, targets),
            device,
            args.repeats,
            recorded=name != "hungarian_scipy",
        )
        for name, assigner in assigners.items()
    }
    times["hungarian_same_as_scipy"] = same(
        assigners["hungarian"](predictions, targets),
        assigners["hungarian_scipy"](predictions, targets),
    )
    unchanged = all(v for r in rows for k, v in r.items() if k.endswith("changes_nothing"))
    return {"batches": rows, "padding_changes_nothing": unchanged, "timed_batch": row} | times


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
    for size in map(int, args.batch.split(",")):
        report["sizes"][size] = measure(args, size)
        print(size, json.dumps(report["sizes"][size]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
