"""The decoder: queries refined layer by layer, each layer's box a correction of the last.

Per layer: self-attention among the queries (with an optional mask: the denoising groups';
or within each query group alone: Group DETR's groups),
deformable cross-attention into the encoder's levels around each query's reference box, a
feed-forward block; then a class head and a box head per layer (the auxiliary losses read every
layer's). The next layer's reference is this layer's box, detached, so each layer learns a
correction of its input rather than the whole chain's (Deformable DETR's iterative refinement).
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn

from falconet_detr.attention import Attention, DeformableAttention
from falconet_detr.boxes import inverse_sigmoid

PRIOR_LOGIT = -math.log((1 - 0.01) / 0.01)
"""Class heads' bias: every class starts at probability 0.01."""


class MLP(nn.Module):
    def __init__(self, cin: int, hidden: int, cout: int, layers: int) -> None:
        super().__init__()
        dims = [cin] + [hidden] * (layers - 1) + [cout]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(dims))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int, levels: int, points: int) -> None:
        super().__init__()
        self.attn = Attention(dim, heads)
        self.cross = DeformableAttention(dim, heads, levels, points)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.ReLU(inplace=True), nn.Linear(ffn, dim))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(3))

    def forward(self, x, pos, reference, memory, shapes, mask=None, groups=1):
        q = x + pos
        x = self.norms[0](x + self.attn(q, q, x, mask, groups))
        x = self.norms[1](x + self.cross(x + pos, reference, memory, shapes))
        return self.norms[2](x + self.ffn(x))


class Decoder(nn.Module):
    def __init__(
        self, dim: int, heads: int, ffn: int, layers: int, classes: int, levels: int, points: int
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(dim, heads, ffn, levels, points) for _ in range(layers)
        )
        self.query_pos = MLP(4, 2 * dim, dim, 2)
        self.scores = nn.ModuleList(nn.Linear(dim, classes) for _ in range(layers))
        self.boxes = nn.ModuleList(MLP(dim, dim, 4, 3) for _ in range(layers))
        for head in self.scores:
            nn.init.constant_(head.bias, PRIOR_LOGIT)
        for head in self.boxes:
            nn.init.zeros_(head.layers[-1].weight)
            nn.init.zeros_(head.layers[-1].bias)

    def forward(
        self,
        queries: torch.Tensor,
        reference_logits: torch.Tensor,
        memory: torch.Tensor,
        shapes: tuple[tuple[int, int], ...],
        mask: torch.Tensor | None = None,
        groups: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``queries [B, Q, D]``, ``reference_logits [B, Q, 4]`` (boxes before the sigmoid),
        ``memory [B, S, D]``: every layer's class logits ``[L, B, Q, C]`` and boxes ``[L, B, Q,
        4]`` ``(cx, cy, w, h)`` in ``[0, 1]``. ``groups``: the queries are that many equal
        blocks, group after group, whose self-attention stays within its own block (only the
        self-attention relates queries, so the groups are independent decoders' inputs)."""
        reference = reference_logits.sigmoid()
        x, logits, boxes = queries, [], []
        for layer, score, box in zip(self.layers, self.scores, self.boxes, strict=True):
            x = layer(x, self.query_pos(reference), reference, memory, shapes, mask, groups)
            refined = (box(x) + inverse_sigmoid(reference)).sigmoid()
            logits.append(score(x))
            boxes.append(refined)
            reference = refined.detach()
        return torch.stack(logits), torch.stack(boxes)
