"""The DETR network as an exported graph: every decoder query's box and class probabilities.

The graph holds the whole network in evaluation mode (query selection's fixed-count ``topk``
included) and the last decoder layer's boxes converted to ``xyxy`` input pixels; choosing the
detections (the ``max_det`` best query-class pairs above ``conf``, no NMS: a set prediction)
stays outside it, as :func:`detections` does (docs/export.md).
"""

from __future__ import annotations

import torch
from torch import nn

from falconet.contract import ExportGraph
from falconet_detr.boxes import cxcywh_to_xyxy

SELECTION = "the max_det best (query, class) pairs whose score is above conf; no NMS"


class DetrExport(nn.Module):
    """``images [B, 3, H, W] -> (boxes [B, Q, 4] xyxy input pixels, scores [B, Q, C])``."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, boxes = self.network(images)  # the last layer's, in evaluation mode
        h, w = images.shape[-2:]
        x1, y1, x2, y2 = cxcywh_to_xyxy(boxes.float()).unbind(-1)
        return torch.stack((x1 * w, y1 * h, x2 * w, y2 * h), -1), logits.float().sigmoid()


@torch.no_grad()
def detections(
    boxes: torch.Tensor, scores: torch.Tensor, *, conf: float, iou: float, max_det: int
) -> list[dict]:
    """What the family's ``postprocess`` returns, from the exported graph's outputs (``iou``
    is unused: no NMS)."""
    classes = scores.shape[-1]
    top, index = scores.flatten(1).topk(min(max_det, scores.shape[1] * classes), 1)
    results = []
    for b in range(len(boxes)):
        above = top[b] > conf
        results.append(
            {
                "boxes": boxes[b, index[b] // classes][above],
                "scores": top[b][above],
                "labels": (index[b] % classes)[above],
            }
        )
    return results


def export_graph(network: nn.Module) -> ExportGraph:
    return ExportGraph(
        module=DetrExport(network).eval(),
        candidates="decoder query (the model's query count, 300 unless the input has fewer cells)",
        selection=SELECTION,
        min_opset=16,  # grid_sample (the deformable attention's sampling)
        detections=detections,
    )
