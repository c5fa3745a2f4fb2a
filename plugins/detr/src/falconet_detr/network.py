"""The RT-DETR-style network: backbone, hybrid encoder, query selection, deformable decoder.

Query selection: every encoder cell proposes a box (a correction of an anchor box centred on
the cell, a size per level) with class scores; the ``queries`` cells of highest score seed the
decoder, their features as its queries and their boxes as its references (both detached: the
encoder's proposals are trained by their own loss). Shapes are static for a fixed input size
(``topk`` of a fixed count), and nothing is read back to the host, so the whole network is a
capture region.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from falconet_detr.backbone import Backbone
from falconet_detr.boxes import inverse_sigmoid
from falconet_detr.decoder import MLP, PRIOR_LOGIT, Decoder
from falconet_detr.denoising import DenoisingQueries
from falconet_detr.encoder import HybridEncoder


@dataclass(frozen=True)
class Scale:
    widths: tuple[int, int, int, int]
    depth: int
    dim: int
    heads: int
    ffn: int
    fuse_depth: int
    layers: int
    queries: int = 300
    points: int = 4


SCALES = {
    "detr-n": Scale((32, 64, 128, 256), 1, 128, 8, 512, 1, 3),
    "detr-s": Scale((64, 128, 256, 512), 2, 256, 8, 1024, 2, 6),
}


class DetrOutputs(NamedTuple):
    """What the network returns in training mode (all tensors, so graph backends can keep
    them as outputs). Boxes are ``(cx, cy, w, h)`` in ``[0, 1]`` of the input.

    ``logits [L, B, Q, C]`` and ``boxes [L, B, Q, 4]`` per decoder layer; ``enc_logits [B, Q,
    C]`` and ``enc_boxes [B, Q, 4]``, the selected proposals (query ``i`` of the decoder
    started from proposal ``i``); ``levels``, the encoder's maps ``[B, D, h, w]`` (the
    denoising pass reads them, and their shapes); ``scale [4]``, ``(W, H, W, H)`` of the
    input, as a tensor made on the device.
    """

    logits: torch.Tensor
    boxes: torch.Tensor
    enc_logits: torch.Tensor
    enc_boxes: torch.Tensor
    levels: tuple[torch.Tensor, ...]
    scale: torch.Tensor


def flatten(levels: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, tuple[tuple[int, int], ...]]:
    """The levels' cells as ``[B, S, D]``, row-major level after level, and their shapes."""
    shapes = tuple((f.shape[-2], f.shape[-1]) for f in levels)
    return torch.cat([f.flatten(2).transpose(1, 2) for f in levels], 1), shapes


def anchor_logits(shapes: tuple[tuple[int, int], ...], like: torch.Tensor) -> torch.Tensor:
    """``[S, 4]`` anchor boxes before the sigmoid: each cell's centre, side 0.05 x 2^level."""
    anchors = []
    for level, (h, w) in enumerate(shapes):
        ys, xs = torch.meshgrid(
            (torch.arange(h, device=like.device, dtype=torch.float32) + 0.5) / h,
            (torch.arange(w, device=like.device, dtype=torch.float32) + 0.5) / w,
            indexing="ij",
        )
        side = torch.full_like(xs, 0.05 * 2.0**level)
        anchors.append(torch.stack((xs, ys, side, side), -1).view(-1, 4))
    return inverse_sigmoid(torch.cat(anchors).clamp(0.01, 0.99)).to(like.dtype)


class DetrNet(nn.Module):
    def __init__(self, scale: Scale, num_classes: int) -> None:
        super().__init__()
        self.num_classes, self.queries = num_classes, scale.queries
        self.backbone = Backbone(scale.widths, scale.depth)
        self.encoder = HybridEncoder(
            self.backbone.channels, scale.dim, scale.heads, scale.ffn, scale.fuse_depth
        )
        levels = len(self.backbone.channels)
        self.decoder = Decoder(
            scale.dim, scale.heads, scale.ffn, scale.layers, num_classes, levels, scale.points
        )
        self.proposal = nn.Sequential(nn.Linear(scale.dim, scale.dim), nn.LayerNorm(scale.dim))
        self.proposal_scores = nn.Linear(scale.dim, num_classes)
        self.proposal_boxes = MLP(scale.dim, scale.dim, 4, 3)
        nn.init.constant_(self.proposal_scores.bias, PRIOR_LOGIT)
        nn.init.zeros_(self.proposal_boxes.layers[-1].weight)
        nn.init.zeros_(self.proposal_boxes.layers[-1].bias)
        self.denoise_labels = nn.Embedding(num_classes, scale.dim)

    def forward(self, images: torch.Tensor):
        """Training: :class:`DetrOutputs`; evaluation: the last layer's ``(logits [B, Q, C],
        boxes [B, Q, 4])``."""
        levels = tuple(self.encoder(self.backbone(images)))
        memory, shapes = flatten(levels)
        features = self.proposal(memory)
        scores = self.proposal_scores(features)  # [B, S, C]
        box_logits = self.proposal_boxes(features) + anchor_logits(shapes, features)
        count = min(self.queries, scores.shape[1])  # a tiny input has fewer cells
        top = scores.max(-1).values.topk(count, 1).indices  # [B, Q]
        enc_logits = scores.gather(1, top[..., None].expand(-1, -1, scores.shape[-1]))
        enc_box_logits = box_logits.gather(1, top[..., None].expand(-1, -1, 4))
        queries = features.gather(1, top[..., None].expand(-1, -1, features.shape[-1]))
        logits, boxes = self.decoder(queries.detach(), enc_box_logits.detach(), memory, shapes)
        if not self.training:
            return logits[-1], boxes[-1]
        h, w = images.shape[-2:]
        scale = torch.stack([images.new_full((), float(v)) for v in (w, h, w, h)]).float()
        return DetrOutputs(logits, boxes, enc_logits, enc_box_logits.sigmoid(), levels, scale)

    def denoise(
        self, levels: tuple[torch.Tensor, ...], queries: DenoisingQueries
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder on the denoising queries alone, over the same encoder maps: every
        layer's logits ``[L, B, T, C]`` and boxes ``[L, B, T, 4]``."""
        memory, shapes = flatten(levels)
        # the loop calls the loss outside the forward's autocast: the pass runs in the
        # precision the forward ran in, read from the maps it made
        dtype = memory.dtype
        with torch.autocast(memory.device.type, dtype=dtype, enabled=dtype != torch.float32):
            return self.decoder(
                self.denoise_labels(queries.labels),
                queries.reference_logits,
                memory,
                shapes,
                queries.mask,
            )
