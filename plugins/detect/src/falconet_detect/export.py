"""The YOLO network as an exported graph: every anchor's decoded box and class probabilities.

The graph holds the network and the decoding (:func:`~falconet_detect.postprocess.
decode_outputs`: the DFL expectation, the distances to ``xyxy`` pixels, the sigmoid); what
depends on the data (threshold, NMS, the cap per image) stays outside it, as
:func:`~falconet_detect.postprocess.select` does it (docs/export.md).
"""

from __future__ import annotations

import torch
from torch import nn

from falconet.contract import ExportGraph
from falconet_detect.postprocess import decode_outputs, select

SELECTION = "per anchor its best class; scores above conf; class-aware NMS at iou; the max_det best"


class YoloExport(nn.Module):
    """``images [B, 3, H, W] -> (boxes [B, A, 4] xyxy input pixels, scores [B, A, C])``."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return decode_outputs(self.network(images))


def detections(
    boxes: torch.Tensor, scores: torch.Tensor, *, conf: float, iou: float, max_det: int
) -> list[dict]:
    """What ``postprocess`` returns, from the exported graph's outputs."""
    return select(boxes, scores, conf=conf, iou=iou, max_det=max_det)


def export_graph(network: nn.Module) -> ExportGraph:
    return ExportGraph(
        module=YoloExport(network).eval(),
        candidates="anchor point (H/8 x W/8 + H/16 x W/16 + H/32 x W/32 of them)",
        selection=SELECTION,
        min_opset=11,
        detections=detections,
    )
