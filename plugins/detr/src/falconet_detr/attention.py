"""The two attentions of the DETR family, every projection an ``nn.Linear`` (so a precision
backend can swap them, e.g. for FP8, which ``nn.MultiheadAttention``'s fused weight prevents).

* :class:`Attention`: multi-head attention through ``scaled_dot_product_attention``; with
  ``groups``, attention within each of that many blocks of the queries alone (the
  block-diagonal mask of Group DETR, run as the blocks folded into the batch: no mask tensor,
  and ``groups`` times fewer products than the masked square).
* :class:`DeformableAttention`: multi-scale deformable attention (Deformable DETR): each query
  samples ``points`` locations per head and level around its reference box, at offsets and with
  weights it predicts, from the levels' value maps by ``grid_sample`` (bilinear, zeros outside);
  no custom CUDA extension. :func:`deformable_sample` is the sampling alone, the part a test
  checks against a per-point loop.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        groups: int = 1,
    ) -> torch.Tensor:
        """``[B, T, D]`` each; ``mask [B, 1, T, S]`` bool, True where a query may attend;
        ``groups``: query ``i`` attends to the keys of its own block alone, the blocks being
        ``groups`` equal consecutive runs of the queries and of the keys (``T`` and ``S``
        divisible by it; no ``mask`` beside it)."""
        b, t, d = query.shape
        if groups > 1:
            if mask is not None:
                raise ValueError("Attention: a mask and query groups together are not supported")
            folded = [x.reshape(b * groups, x.shape[1] // groups, d) for x in (query, key, value)]
            return self.forward(*folded).reshape(b, t, d)

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, -1, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q(query)), split(self.k(key)), split(self.v(value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(out.transpose(1, 2).reshape(b, t, d))


def deformable_sample(
    value: torch.Tensor,
    shapes: tuple[tuple[int, int], ...],
    locations: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """Weighted bilinear samples of multi-level value maps.

    :param value: ``[B, L, H, Dh]``, the levels' cells flattened row-major, level after level.
    :param shapes: ``(height, width)`` of each level (``sum(h * w) == L``).
    :param locations: ``[B, Q, H, levels, P, 2]`` sampling points ``(x, y)`` in ``[0, 1]`` of
        each level (``grid_sample``'s convention with ``align_corners=False``).
    :param weights: ``[B, Q, H, levels, P]``.
    :returns: ``[B, Q, H * Dh]``.
    """
    b, _, heads, dh = value.shape
    q, points = locations.shape[1], locations.shape[4]
    per_level = value.split([h * w for h, w in shapes], 1)
    grid = 2 * locations - 1
    sampled = []
    for level, (h, w) in enumerate(shapes):
        maps = per_level[level].permute(0, 2, 3, 1).reshape(b * heads, dh, h, w)
        where = grid[:, :, :, level].permute(0, 2, 1, 3, 4).reshape(b * heads, q, points, 2)
        sampled.append(F.grid_sample(maps, where, "bilinear", "zeros", align_corners=False))
    stacked = torch.stack(sampled, -2)  # [B * H, Dh, Q, levels, P]
    weight = weights.permute(0, 2, 1, 3, 4).reshape(b * heads, 1, q, len(shapes), points)
    out = (stacked * weight).sum((-1, -2))  # [B * H, Dh, Q]
    return out.view(b, heads * dh, q).transpose(1, 2)


class DeformableAttention(nn.Module):
    def __init__(self, dim: int, heads: int = 8, levels: int = 3, points: int = 4) -> None:
        super().__init__()
        self.heads, self.levels, self.points = heads, levels, points
        self.offsets = nn.Linear(dim, heads * levels * points * 2)
        self.weights = nn.Linear(dim, heads * levels * points)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self._reset()

    def _reset(self) -> None:
        """Offsets start as points spread on rays around the reference, one direction per
        head (Deformable DETR's initialisation); uniform weights."""
        nn.init.zeros_(self.offsets.weight)
        angles = torch.arange(self.heads) * (2 * math.pi / self.heads)
        rays = torch.stack((angles.cos(), angles.sin()), -1)
        rays = rays / rays.abs().max(-1, keepdim=True).values
        rays = rays[:, None, None].repeat(1, self.levels, self.points, 1)
        rays = rays * torch.arange(1, self.points + 1).view(1, 1, -1, 1)
        with torch.no_grad():
            self.offsets.bias.copy_(rays.flatten())
        nn.init.zeros_(self.weights.weight)
        nn.init.zeros_(self.weights.bias)
        nn.init.xavier_uniform_(self.value.weight)
        nn.init.zeros_(self.value.bias)
        nn.init.xavier_uniform_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(
        self,
        query: torch.Tensor,
        reference: torch.Tensor,
        memory: torch.Tensor,
        shapes: tuple[tuple[int, int], ...],
    ) -> torch.Tensor:
        """``query [B, Q, D]``, ``reference [B, Q, 4]`` boxes ``(cx, cy, w, h)`` in ``[0, 1]``,
        ``memory [B, L, D]``: ``[B, Q, D]``. Points lie at offsets scaled by half the box."""
        b, q, d = query.shape
        value = self.value(memory).view(b, -1, self.heads, d // self.heads)
        shape = (b, q, self.heads, self.levels, self.points)
        offsets = self.offsets(query).view(*shape, 2)
        weights = self.weights(query).view(b, q, self.heads, -1).softmax(-1).view(shape)
        centre, size = reference[:, :, None, None, None, :2], reference[:, :, None, None, None, 2:]
        locations = centre + offsets / self.points * size * 0.5
        return self.out(deformable_sample(value, shapes, locations, weights))
