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


def on_eager_kernels() -> bool:
    """Whether this forward runs on PyTorch's own kernels (ATen, cuDNN), for which the copies
    C2f, SPPF and the head place (each explained where it is) were measured to pay.

    Under ``torch.compile`` Inductor writes the kernels and picks the layouts itself, and there
    the placements were measured to cost: with SPPF's pools converted to the contiguous layout,
    Inductor fused the three pools' backwards and the conversions into kernels of 1.07, 0.74
    and 0.17 ms a step (fp16, batch 16, H200); the fused whole step took 10.6 ms with the
    placements and 9.2 ms without (docs/performance.md). So a compiled network is traced in
    the forms before the placements, the forms whose fused accuracy was measured."""
    return not torch.compiler.is_compiling()


class Conv(nn.Module):
    """Convolution (no bias), BatchNorm, SiLU.

    The SiLU is not in place: its backward reads its input, so under autograd an in-place SiLU
    first copies the BatchNorm output it overwrites (one more kernel over the activation per
    block, and no memory saved); out of place, it writes its output and keeps the input.

    BatchNorm and SiLU go through :func:`falconet.ops.batch_norm_silu`, which a graph backend
    may run as one fused kernel (``bn_silu=triton``, docs/performance.md)."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=BN_EPS, momentum=BN_MOMENTUM)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``residual`` is added to the output; ``out`` is where a backend may write it (a
        slice of a concatenation's buffer: :func:`falconet.ops.concat_buffer`)."""
        return ops.batch_norm_silu(self.conv(x), self.bn, residual, out)


class Bottleneck(nn.Module):
    """Two 3x3 convolutions with an optional residual connection."""

    def __init__(self, c: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1, self.cv2 = Conv(c, c, 3), Conv(c, c, 3)
        self.add = shortcut

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.cv2(self.cv1(x), x if self.add else None, out)


class C2f(nn.Module):
    """CSP stage: split, run ``n`` bottlenecks on one half, concatenate every intermediate."""

    def __init__(self, c_in: int, c_out: int, n: int, shortcut: bool) -> None:
        super().__init__()
        self.c = c_out // 2
        self.cv1 = Conv(c_in, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c_out, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.m and on_eager_kernels()):
            y = list(self.cv1(x).chunk(2, 1))
            for block in self.m:
                y.append(block(y[-1]))
            return self.cv2(torch.cat(y, 1))
        # Each part is written where a backend can into its channels of the concatenation's
        # buffer (ops.concat_buffer; the fused BatchNorm+SiLU does), so that joining them
        # copies nothing; run as is there is no buffer and the parts are concatenated.
        z = self.cv1.conv(x)
        buffer = ops.concat_buffer(z, (2 + len(self.m)) * self.c)
        parts = list(
            ops.batch_norm_silu(z, self.cv1.bn, None, self._slot(buffer, 0, 2)).chunk(2, 1)
        )
        for i, block in enumerate(self.m):
            dense = _dense(parts[-1])
            if buffer is None:  # joined as read: the gradients add up in the order they did
                parts[-1] = dense
            parts.append(block(dense, self._slot(buffer, 2 + i, 1)))
        return self.cv2(ops.concat_channels(parts, buffer))

    def _slot(self, buffer: torch.Tensor | None, first: int, count: int) -> torch.Tensor | None:
        """Channels ``[first, first + count)`` of ``c`` each in ``buffer``, if there is one."""
        return None if buffer is None else buffer[:, first * self.c : (first + count) * self.c]


def _dense(x: torch.Tensor) -> torch.Tensor:
    """``x``, copied if it is a slice of channels (a strided view).

    The first convolution (cuDNN) would copy such a view densely for its forward and again for
    its weight's gradient (autograd keeps the view); copied here once, the copy is what the
    backward keeps. Same values, same gradients bit for bit (docs/performance.md,
    bench_blocks.py)."""
    if x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last):
        return x
    return x.clone(memory_format=torch.preserve_format)


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools, concatenated.

    The pools run in the contiguous (NCHW) layout whatever the network's: PyTorch's
    channels-last max-pool kernels took 46 us forward and 75 us backward per pool on yolo-n's
    20 x 20 map at batch 16 on an H200, and the contiguous ones with the conversions there and
    back take 0.16 ms less per training pass there (no change at batch 64;
    docs/performance.md). The maxima are the same in either layout, and so were the winners
    of ties: the loss and every gradient came out bit for bit the same (fp16 and bf16 on the
    H200, fp32 on the CPU; tools/bench_blocks.py). Under ``torch.compile`` they pool in the
    input's layout (:func:`on_eager_kernels`)."""

    def __init__(self, c_in: int, c_out: int, k: int = 5) -> None:
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1)
        self.cv2 = Conv(hidden * 4, c_out, 1)
        self.pool = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        if not on_eager_kernels():
            p1 = self.pool(x)
            p2 = self.pool(p1)
            return self.cv2(torch.cat((x, p1, p2, self.pool(p2)), 1))
        p1 = self.pool(x.contiguous())
        p2 = self.pool(p1)
        p3 = self.pool(p2)
        layout = _layout(x)  # back to x's layout, so the concatenation is one batched copy
        pooled = [p.contiguous(memory_format=layout) for p in (p1, p2, p3)]
        return self.cv2(torch.cat((x, *pooled), 1))


def _layout(x: torch.Tensor) -> torch.memory_format:
    """The memory format ``x`` is dense in: channels-last or contiguous."""
    if x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


class Upsample2x(nn.Module):
    """Nearest-neighbour 2x upsampling in the input's own dtype.

    Autocast runs ``upsample_nearest2d`` in float32, so under fp16 or bf16 the upsampled map,
    and the concatenation it joins, would be float32: twice the bytes, a cast in and a cast
    out, and the next convolution casts back. A nearest upsample only copies values, so the
    input's dtype loses nothing: the forward gives the same numbers as float32 does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return F.interpolate(x, scale_factor=2.0, mode="nearest")
