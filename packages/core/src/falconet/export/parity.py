"""The parity check: the written file, run by onnxruntime on the CPU, against PyTorch.

Both run the same letterboxed images; per image, the ``TOP`` highest-scoring (candidate, class)
pairs of the two are compared: the sorted scores one for one, and each PyTorch pair's box with
the nearest box of the same class among the file's ``2 x TOP`` best pairs. Comparing the best
pairs, not candidate by candidate, keeps the check meaningful where the candidates' order is
decided inside the graph: a DETR graph picks its queries by ``topk`` over encoder scores,
where near-equal scores may come out in another order (the same set of detections, permuted).
The tolerances (:data:`SCORE_TOLERANCE`, :data:`BOX_TOLERANCE`) are for float32 on the CPU;
docs/export.md describes the check, docs/lab/2026-12-07-export-parity.md records what it
measured at 640 px.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from falconet.contract import ExportGraph
from falconet.export.onnx_file import INPUT, require

TOP = 100
SCORE_TOLERANCE = 1e-4
"""Largest difference in a class probability."""
BOX_TOLERANCE = 1e-4
"""Largest difference in a box coordinate, as a fraction of the input's side (0.064 px at 640):
float32 rounding grows with the coordinates' size."""


@dataclass(frozen=True)
class Parity:
    """What one batch measured: the largest score and box (pixels) differences over its
    images' ``pairs`` best (candidate, class) pairs, and the tolerances they are held to."""

    batch: int
    pairs: int
    score_error: float
    box_error: float
    score_tolerance: float
    box_tolerance: float

    @property
    def ok(self) -> bool:
        return self.score_error <= self.score_tolerance and self.box_error <= self.box_tolerance


def compare(
    reference: tuple[torch.Tensor, torch.Tensor],
    exported: tuple[torch.Tensor, torch.Tensor],
    side: int,
) -> Parity:
    """``(boxes [B, N, 4], scores [B, N, C])`` of PyTorch and of the file, for an input of
    ``side`` pixels, compared as the module docstring says."""
    (ref_boxes, ref_scores), (got_boxes, got_scores) = reference, exported
    batch, candidates, classes = ref_scores.shape
    k = min(TOP, candidates * classes)
    score_error = box_error = 0.0
    for b in range(batch):
        ref_top, ref_index = ref_scores[b].flatten().topk(k)
        got_top, got_index = got_scores[b].flatten().topk(min(2 * k, candidates * classes))
        score_error = max(score_error, float((ref_top - got_top[:k]).abs().max()))
        ref_box = ref_boxes[b, ref_index // classes]  # [k, 4]
        got_box = got_boxes[b, got_index // classes]  # [2k, 4]
        distance = (ref_box[:, None] - got_box[None]).abs().amax(-1)
        other_class = (ref_index % classes)[:, None] != (got_index % classes)[None]
        distance = distance.masked_fill(other_class, float("inf"))
        box_error = max(box_error, float(distance.min(1).values.max()))
    return Parity(batch, k * batch, score_error, box_error, SCORE_TOLERANCE, BOX_TOLERANCE * side)


def session(path: Path):
    """An onnxruntime CPU session of ``path``."""
    ort = require("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: no notes about unused initialisers
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@torch.no_grad()
def check_parity(
    graph: ExportGraph, path: Path, images: torch.Tensor, batches: Sequence[int]
) -> list[Parity]:
    """One :class:`Parity` per batch size of ``batches``, each run on the first images of
    ``images`` (``[M, 3, H, W]`` float32 in ``[0, 1]``, ``M >= max(batches)``)."""
    run = session(path)
    results = []
    for batch in batches:
        chunk = images[:batch].contiguous()
        reference = graph.module(chunk)
        boxes, scores = run.run(None, {INPUT: chunk.numpy()})
        exported = (torch.from_numpy(np.asarray(boxes)), torch.from_numpy(np.asarray(scores)))
        results.append(compare(reference, exported, max(chunk.shape[-2:])))
    return results
