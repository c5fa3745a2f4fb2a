"""The hybrid encoder (RT-DETR): attention within the top level only, where the cells are
few (AIFI), then convolutional fusion across the levels, top-down and bottom-up (CCFM).
Attention over every level's cells is what made DETR encoders slow; the top level holds the
semantics worth relating, the lower levels get them through the fusion."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from falconet.grad_checkpoint import checkpoint
from falconet_detr.attention import Attention
from falconet_detr.backbone import ConvNorm


def sincos_2d(h: int, w: int, dim: int, like: torch.Tensor) -> torch.Tensor:
    """``[h * w, dim]`` fixed sine-cosine position embedding of a row-major ``h x w`` grid.
    Made on the device from ``arange`` (no host copy: capturable in a CUDA graph)."""
    quarter = dim // 4
    omega = 1.0 / 10000 ** (
        torch.arange(quarter, device=like.device, dtype=torch.float32) / quarter
    )
    ys, xs = torch.meshgrid(
        torch.arange(h, device=like.device, dtype=torch.float32),
        torch.arange(w, device=like.device, dtype=torch.float32),
        indexing="ij",
    )
    x = xs.flatten()[:, None] * omega
    y = ys.flatten()[:, None] * omega
    return torch.cat((x.sin(), x.cos(), y.sin(), y.cos()), 1).to(like.dtype)


class EncoderLayer(nn.Module):
    """Post-norm transformer layer; the position embedding is added to queries and keys."""

    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.attn = Attention(dim, heads)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q = x + pos
        x = self.norm1(x + self.attn(q, q, x))
        return self.norm2(x + self.ffn(x))


class Fuse(nn.Module):
    """Two maps concatenated, mixed to ``dim`` channels, refined by residual 3x3 convolutions."""

    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.mix = ConvNorm(2 * dim, dim, 1)
        self.refine = nn.ModuleList(ConvNorm(dim, dim, 3) for _ in range(depth))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = self.mix(torch.cat((a, b), 1))
        for conv in self.refine:
            x = x + conv(x)
        return x


class HybridEncoder(nn.Module):
    """With ``grad_checkpoint`` the attention layer and each fusion block recompute their
    activations in the backward (:func:`falconet.grad_checkpoint.checkpoint`)."""

    def __init__(
        self,
        channels: tuple[int, ...],
        dim: int,
        heads: int,
        ffn: int,
        depth: int,
        grad_checkpoint: bool = False,
    ) -> None:
        super().__init__()
        self.grad_checkpoint = grad_checkpoint
        self.project = nn.ModuleList(ConvNorm(c, dim, 1, act=False) for c in channels)
        self.intra = EncoderLayer(dim, heads, ffn)
        levels = len(channels)
        self.lateral = nn.ModuleList(ConvNorm(dim, dim, 1) for _ in range(levels - 1))
        self.top_down = nn.ModuleList(Fuse(dim, depth) for _ in range(levels - 1))
        self.down = nn.ModuleList(ConvNorm(dim, dim, 3, 2) for _ in range(levels - 1))
        self.bottom_up = nn.ModuleList(Fuse(dim, depth) for _ in range(levels - 1))

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        run = checkpoint if self.grad_checkpoint else _plain
        maps = [project(f) for project, f in zip(self.project, features, strict=True)]
        top = maps[-1]
        b, d, h, w = top.shape
        flat = top.flatten(2).transpose(1, 2)
        flat = run(self.intra, flat, sincos_2d(h, w, d, flat))
        maps[-1] = flat.transpose(1, 2).reshape(b, d, h, w)
        # top-down: each level gets the one above, upsampled
        inner = [maps[-1]]
        for i in range(len(maps) - 2, -1, -1):
            higher = self.lateral[i](inner[0])
            inner[0] = higher
            up = F.interpolate(higher, size=maps[i].shape[-2:], mode="nearest")
            inner.insert(0, run(self.top_down[i], up, maps[i]))
        # bottom-up: each level gets the one below, downsampled
        outs = [inner[0]]
        for i in range(len(maps) - 1):
            outs.append(run(self.bottom_up[i], self.down[i](outs[-1]), inner[i + 1]))
        return outs


def _plain(block: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    return block(*inputs)
