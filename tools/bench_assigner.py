"""The task-aligned assigner at real batch shapes: as it is (``[B, M, A]``, ``M`` the padded
largest box count) against compacted to the batch's real boxes (``[N, A]``, ``N`` the
padded total), with the outputs compared bit for bit.

Most of the assigner's work is elementwise over ``[B, M, A]``, and with mosaic a batch's
largest box count is several times its mean, so most rows are padding (fusing the loss with
Inductor took 1.4 ms off the whole step at batch 16, docs/performance.md). This script
measures what computing on the real boxes only would save, before the product carries a
second target bucket for it: batches come from the trainer's own loader (COCO128, mosaic,
``--batch``), predictions from the untrained network's forward pass, and the assigner's
inputs are taken from the YOLO loss as it calls the assigner. ``compact_tal`` is written
here, to be measured first; it gives the same assignment as ``tal`` up to NaN predictions
(checked on every batch). On a GPU each version is recorded as a CUDA graph and replayed (no
launch cost, as in whole-step), median of ``--repeats``; on the CPU, wall time.

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

from falconet.data.transforms import next_bucket
from falconet.training.trainer import TARGET_KEYS
from falconet_detect.assigners.common import assignment
from falconet_detect.assigners.tal import EPS, TaskAlignedAssigner, centres_inside
from falconet_detect.boxes import pairwise_iou


def box_rows(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``image [N]`` and ``slot [N]`` of every real box, padded to a bucket of the total with
    image ``B`` (no image) and slot 0. Made on the host, where the counts are known."""
    batch = len(counts)
    image = torch.repeat_interleave(torch.arange(batch), counts)
    slot = torch.cat([torch.arange(int(c)) for c in counts]) if batch else image
    pad = next_bucket(len(image)) - len(image)
    return torch.cat((image, image.new_full((pad,), batch))), torch.cat((slot, slot.new_zeros(pad)))


@torch.no_grad()
def compact_tal(
    tal: TaskAlignedAssigner,
    pred_scores: torch.Tensor,
    pred_boxes: torch.Tensor,
    anchor_points: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_labels: torch.Tensor,
    image: torch.Tensor,
    slot: torch.Tensor,
):
    """``tal``'s assignment computed over the ``N`` real boxes: per-box work on ``[N, A]``,
    per-anchor reductions over an image's boxes by ``index_add_`` (sums of 0/1, exact) and
    ``index_reduce_`` (maxima and minima, exact in any order)."""
    batch, anchors, classes = pred_scores.shape
    slots = gt_boxes.shape[1]
    real = (image < batch).float()
    owner_image = image.clamp(max=batch - 1)
    boxes, labels = gt_boxes[owner_image, slot], gt_labels[owner_image, slot]  # [N, 4], [N]
    inside = centres_inside(anchor_points, boxes[None])[0].float() * real[:, None]  # [N, A]
    scores = pred_scores[
        owner_image[:, None], torch.arange(anchors, device=image.device), labels[:, None]
    ]
    ious = pairwise_iou(boxes[:, None], pred_boxes[owner_image])[:, 0] * inside
    align = scores.pow(tal.alpha) * ious.pow(tal.beta) * inside
    top = align.topk(min(tal.topk, anchors), dim=-1).indices
    chosen = torch.zeros_like(align).scatter_(-1, top, 1.0) * inside

    def per_image(values: torch.Tensor, reduce: str, start: float) -> torch.Tensor:
        out = values.new_full((batch + 1, anchors), start)
        if reduce == "sum":
            return out.index_add_(0, image, values)
        return out.index_reduce_(0, image, values, reduce, include_self=True)

    claimed = per_image(chosen, "sum", 0.0)[image]  # [N, A]: boxes claiming the anchor
    best_iou = per_image(ious, "amax", 0.0)[image]
    ranked = torch.where(ious == best_iou, slot[:, None].to(ious.dtype), float(slots))
    first = per_image(ranked, "amin", float(slots))[image]  # argmax's first-index tie rule
    best = (slot[:, None].to(ious.dtype) == first).to(chosen.dtype)
    chosen = torch.where(claimed > 1, best * inside, chosen)
    foreground = per_image(chosen, "sum", 0.0)[:batch].clamp(max=1)
    align = align * chosen
    scale = (ious * chosen).amax(-1, keepdim=True) / (align.amax(-1, keepdim=True) + EPS)
    strength = per_image(align * scale, "amax", 0.0)[:batch]
    owner = per_image(chosen * slot[:, None].to(chosen.dtype), "sum", 0.0)[:batch].long()
    return assignment(owner, foreground, strength, gt_boxes, gt_labels, classes, pred_scores.dtype)


class Capture:
    """Stands in for the loss's assigner once, to keep the arguments the loss passes it."""

    def __init__(self, assigner) -> None:
        self.assigner, self.args = assigner, None

    def __call__(self, *args, **kwargs):
        self.args = args
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
    return capture.args


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
        project=str(tmp), exist_ok=True, name=f"assigner-b{batch_size}",
    )  # fmt: skip
    trainer = build(keys)
    tal = TaskAlignedAssigner()
    rows, worst = [], None
    for batch in fetch_batches(trainer, args.batches):
        inputs = assigner_inputs(trainer, batch)
        scores, boxes, anchors, gt_boxes, gt_labels = inputs[:5]
        image, slot = (t.to(trainer.device) for t in box_rows(batch["counts"]))
        equal = same(
            tal(*inputs[:6]),
            compact_tal(tal, scores, boxes, anchors, gt_boxes, gt_labels, image, slot),
        )
        row = {"M": gt_boxes.shape[1], "boxes": int(batch["counts"].sum()), "N": len(image)}
        rows.append(row | {"equal": equal})
        if worst is None or row["M"] * batch_size > worst[0]:
            worst = (row["M"] * batch_size, inputs[:6], image, slot, row)
    _, inputs, image, slot, row = worst
    scores, boxes, anchors, gt_boxes, gt_labels, _ = inputs
    padded = time_ms(lambda: tal(*inputs), trainer.device, args.repeats)
    compact = time_ms(
        lambda: compact_tal(tal, scores, boxes, anchors, gt_boxes, gt_labels, image, slot),
        trainer.device,
        args.repeats,
    )
    return {
        "batches": rows,
        "all_equal": all(r["equal"] for r in rows),
        "timed_batch": row,
        "tal_ms": padded,
        "compact_ms": compact,
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
