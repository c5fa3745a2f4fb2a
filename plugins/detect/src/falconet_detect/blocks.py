"""The YOLO family's building blocks: Conv-BN-SiLU, the CSP bottleneck stack (C2f), SPPF and
the neck's 2x upsampling.

BatchNorm uses the family's settings (eps 1e-3, momentum 0.03): the running statistics follow
the data quickly, which the short schedules and strong augmentation of detection want.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from falconet import ops

BN_EPS, BN_MOMENTUM = 1e-3, 0.03


class Conv(nn.Module):
    """Convolution (no bias), BatchNorm, SiLU (:func:`falconet.ops.batch_norm_silu`, which a
    graph backend may run as one fused kernel: ``bn_silu=triton``, docs/performance.md)."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=BN_EPS, momentum=BN_MOMENTUM)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        out: ops.ConcatPart | None = None,
    ) -> torch.Tensor:
        """``x [B, c_in, H, W] -> [B, c_out, H / s, W / s]``; ``residual`` is added to the
        output; ``out`` is the part of a concatenation the output joins (a backend may write
        it there)."""
        return ops.batch_norm_silu(self.conv(x), self.bn, residual, out)


class Bottleneck(nn.Module):
    """Two 3x3 convolutions with an optional residual connection: ``[B, c, H, W]`` in and out."""

    def __init__(self, c: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1, self.cv2 = Conv(c, c, 3), Conv(c, c, 3)
        self.add = shortcut

    def forward(self, x: torch.Tensor, out: ops.ConcatPart | None = None) -> torch.Tensor:
        return self.cv2(self.cv1(x), x if self.add else None, out)


class C2f(nn.Module):
    """CSP stage: split, run ``n`` bottlenecks on one half, concatenate every intermediate.

    ``[B, c_in, H, W] -> [B, c_out, H, W]``. Each bottleneck reads its input as
    :func:`falconet.ops.dense` gives it, and each part is declared as a part of the
    concatenation (:class:`falconet.ops.ChannelConcat`), where a backend may write it."""

    def __init__(self, c_in: int, c_out: int, n: int, shortcut: bool) -> None:
        super().__init__()
        self.c = c_out // 2
        self.cv1 = Conv(c_in, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c_out, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cat = ops.ChannelConcat((2 + len(self.m)) * self.c)
        y = list(self.cv1(x, out=cat.part(2 * self.c)).chunk(2, 1))
        for block in self.m:
            y[-1] = ops.dense(y[-1])
            y.append(block(y[-1], out=cat.part(self.c)))
        return self.cv2(cat(y))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools, concatenated.

    ``[B, c_in, H, W] -> [B, c_out, H, W]``; the pools' layout is
    :func:`falconet.ops.max_pool_chain`'s."""

    def __init__(self, c_in: int, c_out: int, k: int = 5) -> None:
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1)
        self.cv2 = Conv(hidden * 4, c_out, 1)
        self.pool = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        return self.cv2(torch.cat((x, *ops.max_pool_chain(x, self.pool, 3)), 1))


class Upsample2x(nn.Module):
    """Nearest-neighbour 2x upsampling in the input's own dtype.

    Autocast runs ``upsample_nearest2d`` in float32, so under fp16 or bf16 the upsampled map,
    and the concatenation it joins, would be float32: twice the bytes, a cast in and a cast
    out, and the next convolution casts back. A nearest upsample only copies values, so the
    input's dtype loses nothing: the forward gives the same numbers as float32 does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return F.interpolate(x, scale_factor=2.0, mode="nearest")
