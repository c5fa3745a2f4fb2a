"""BatchNorm and SiLU as one op on Triton kernels, for the whole step (``bn_silu=triton``).

With the launches gone, BatchNorm and SiLU are the largest kernel cost of a small detector's
step (docs/performance.md): PyTorch runs cuDNN's BatchNorm (its native kernels in bf16), then
SiLU apart: six kernels and about thirteen passes over the activation a layer, forward and
backward. The op ``falconet_graphs::bn_silu`` does it in six kernels and eight passes
(:mod:`falconet_graphs_cuda.bn_silu_kernels`, launched as
:mod:`falconet_graphs_cuda.bn_silu_tiling` plans them). Its numbers agree with PyTorch's to
rounding, not bit for bit (other reductions), so it is an opt-in whose accuracy the overfit
check measures.

:class:`FusedBatchNormSiLU` is the function mode the whole step enters around the forward:
it answers for :func:`falconet.ops.batch_norm_silu` when the BatchNorm trains with running
statistics and a momentum and the input is a dense channels-last (or NCHW with one pixel)
tensor on the GPU; anything else (evaluation too) runs as the family wrote it. The op writes
each part of a :class:`falconet.ops.ChannelConcat` (C2f's) into its channels of one buffer,
a residual added in the same kernel, and :func:`falconet.ops.concat_channels` is then the
buffer, with no copy (docs/lab/2026-12-kernel-cost.md, "Kept: C2f's parts written in place").
"""

from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakTensorKeyDictionary

from falconet import ops

# Tiling, KERNEL_KINDS and tiling_from_env are also importable from here, where they began
from falconet_graphs_cuda.bn_silu_tiling import KERNEL_KINDS as KERNEL_KINDS
from falconet_graphs_cuda.bn_silu_tiling import Tiling as Tiling
from falconet_graphs_cuda.bn_silu_tiling import plan_launch
from falconet_graphs_cuda.bn_silu_tiling import tiling_from_env as tiling_from_env

# the tiling the ops use, read at each call (tools/bench_bn_silu.py sets another)
TILING = tiling_from_env()


class FusedBatchNormSiLU(TorchFunctionMode):
    """Within ``with``: :func:`falconet.ops.batch_norm_silu` on the fused op where it
    qualifies (module docstring). ``interpret``: qualify CPU tensors too, for Triton's
    interpreter (``TRITON_INTERPRET=1``, the CPU tests)."""

    def __init__(self, interpret: bool = False) -> None:
        super().__init__()
        self.interpret = interpret
        self._copied_from = WeakTensorKeyDictionary()  # ops.dense's copies -> what they copy

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is ops.batch_norm_silu:
            return self._batch_norm_silu(func, *args, **kwargs)
        if func is ops.dense:
            (x,) = args
            copy = func(x)
            if copy is not x:
                self._copied_from[copy] = x
            return copy
        if func is ops.concat_channels:
            parts, concat = args  # a part ops.dense copied joins as the slice it copies
            in_place = [self._copied_from.get(p, p) for p in parts]
            buffer = None if concat is None else concat.buffer
            if buffer is not None and _lies_in(in_place, buffer):
                return _Assemble.apply(buffer, *in_place)
            return torch.cat(tuple(parts), 1)
        return func(*args, **kwargs)

    def _batch_norm_silu(self, func, x, bn, residual=None, out=None):
        if not (self._qualifies(x, bn) and (residual is None or self._alike(residual, x))):
            return func(x, bn, residual, out)  # as the family wrote it (the mode is off here)
        out = None if out is None else self._place(out, x)
        z = _BatchNormSiLU.apply(
            x, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum, bn.eps,
            residual, out,
        )  # fmt: skip
        if bn.num_batches_tracked is not None:  # the whole step passes None (it counts)
            bn.num_batches_tracked.add_(1)
        return z

    def _dense(self, x: torch.Tensor) -> bool:
        """A dense channels-last activation on a device the kernels run on."""
        if x.device.type != "cuda" and not self.interpret:
            return False
        if x.dim() != 4 or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return False
        return x.is_contiguous(memory_format=torch.channels_last) and x.numel() > 0

    def _alike(self, residual: torch.Tensor, x: torch.Tensor) -> bool:
        """A residual the kernel reads as it reads ``x``: dense, same shape and dtype."""
        return self._dense(residual) and residual.shape == x.shape and residual.dtype == x.dtype

    def _place(self, part: ops.ConcatPart, x: torch.Tensor) -> torch.Tensor | None:
        """Where the op writes its output for ``x`` as ``part`` of a concatenation: its
        channels of the concatenation's buffer, made here on the first write (dense
        channels-last, ``x``'s batch, size and dtype); None (fresh memory, which the
        concatenation then copies) where that slice cannot take it."""
        concat = part.concat
        if concat.buffer is None:
            n, _, h, w = x.shape
            concat.buffer = torch.empty(
                (n, concat.channels, h, w), dtype=x.dtype, device=x.device,
                memory_format=torch.channels_last,
            )  # fmt: skip
        out = concat.buffer[:, part.first : part.first + part.width]
        return out if self._fits(out, x) else None

    @staticmethod
    def _fits(out: torch.Tensor, x: torch.Tensor) -> bool:
        """``out`` can take the op's output for ``x``: same shape, dtype and device, its rows
        evenly spaced (:func:`_row_stride`)."""
        same = out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
        return same and _row_stride(out) is not None

    def _qualifies(self, x: torch.Tensor, bn: nn.Module) -> bool:
        if not (isinstance(bn, nn.BatchNorm2d) and bn.training and bn.affine):
            return False
        if bn.running_mean is None or bn.momentum is None:
            return False
        stats = (bn.weight, bn.bias, bn.running_mean, bn.running_var)
        if any(t.dtype != torch.float32 or not t.is_contiguous() for t in stats):
            return False
        return self._dense(x)


# --------------------------------------------------------------------------- the ops
@torch.library.custom_op(
    "falconet_graphs::bn_silu", mutates_args=("running_mean", "running_var", "out")
)
def bn_silu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    momentum: float,
    eps: float,
    residual: torch.Tensor | None,
    out: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(batch_norm(x))`` with the batch's statistics (plus ``residual``, if given),
    written to ``out``, the running statistics updated; returns the batch's mean and its
    1/std (what the backward reads). ``out`` is channels-last with ``x``'s shape, or a slice
    of a wider channels-last tensor's channels (:func:`_row_stride`)."""
    from falconet_graphs_cuda import bn_silu_kernels as k

    p = plan_launch(x, TILING)
    partial_mean = x.new_empty((p.programs, p.channels), dtype=torch.float32)
    partial_m2 = torch.empty_like(partial_mean)
    mean = x.new_empty(p.channels, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    k.bn_silu_stats[p.reduce_grid](
        x, partial_mean, partial_m2, p.rows, p.channels, p.per_program, **p.meta("reduce")
    )
    k.bn_silu_stats_merge[p.merge_grid](
        partial_mean, partial_m2, mean, rstd, running_mean, running_var,
        p.rows, p.channels, p.per_program, p.programs, momentum, eps, **p.meta("merge"),
    )  # fmt: skip
    k.bn_silu_normalise[p.map_grid](  # without a residual, x stands in for its (unread) pointer
        x, out, mean, rstd, weight, bias, x if residual is None else residual, p.rows,
        p.channels, _row_stride(out), HAS_RESIDUAL=residual is not None, **p.meta("map"),
    )  # fmt: skip
    return mean, rstd


@bn_silu.register_fake
def _(x, weight, bias, running_mean, running_var, momentum, eps, residual, out):
    mean = x.new_empty(x.shape[1], dtype=torch.float32)
    return mean, torch.empty_like(mean)


def _row_stride(t: torch.Tensor) -> int | None:
    """The distance between the rows (pixels) of a 4-d tensor whose channels are adjacent and
    whose pixels are evenly spaced: channels-last, or a slice of a channels-last tensor's
    channels; None for any other layout."""
    n, c, h, w = t.shape
    row = t.stride(3) if w > 1 else t.stride(2) if h > 1 else t.stride(0) if n > 1 else c
    if c > 1 and t.stride(1) != 1:
        return None
    if row < c or (h > 1 and t.stride(2) != w * row) or (n > 1 and t.stride(0) != h * w * row):
        return None
    return row


@torch.library.custom_op("falconet_graphs::bn_silu_backward", mutates_args=())
def bn_silu_backward(
    grad_z: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of the input, the weight and the bias."""
    from falconet_graphs_cuda import bn_silu_kernels as k

    grad_z = grad_z.contiguous(memory_format=torch.channels_last)
    p = plan_launch(x, TILING)
    partial_dy = x.new_empty((p.programs, p.channels), dtype=torch.float32)
    partial_dy_xhat = torch.empty_like(partial_dy)
    grad_bias = torch.empty_like(bias)
    grad_weight = torch.empty_like(weight)
    grad_x = torch.empty_like(x, memory_format=torch.channels_last)
    k.bn_silu_grad_sums[p.reduce_grid](
        grad_z, x, mean, rstd, weight, bias, partial_dy, partial_dy_xhat,
        p.rows, p.channels, p.per_program, **p.meta("reduce"),
    )  # fmt: skip
    k.bn_silu_grad_merge[p.merge_grid](
        partial_dy, partial_dy_xhat, grad_bias, grad_weight, p.channels, p.programs,
        **p.meta("merge"),
    )  # fmt: skip
    k.bn_silu_input_grad[p.map_grid](
        grad_z, x, grad_x, mean, rstd, weight, bias, grad_bias, grad_weight, p.rows,
        p.channels, **p.meta("map"),
    )  # fmt: skip
    return grad_x, grad_weight, grad_bias


@bn_silu_backward.register_fake
def _(grad_z, x, weight, bias, mean, rstd):
    grad_x = torch.empty_like(x, memory_format=torch.channels_last)
    return grad_x, torch.empty_like(weight), torch.empty_like(bias)


class _BatchNormSiLU(torch.autograd.Function):
    """Autograd for the pair of ops (a custom op that updates the running statistics in place
    cannot carry an autograd formula of its own). ``out``, when given, is written and returned
    (as an alias: :func:`_alias`); the residual's gradient is the output's."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps, residual=None,
                out=None):  # fmt: skip
        z = torch.empty_like(x, memory_format=torch.channels_last) if out is None else out
        mean, rstd = torch.ops.falconet_graphs.bn_silu(
            x, weight, bias, running_mean, running_var, momentum, eps, residual, z
        )
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.has_residual = residual is not None
        return z if out is None else _alias(out)

    @staticmethod
    def backward(ctx, grad_z):
        grad_x, grad_weight, grad_bias = torch.ops.falconet_graphs.bn_silu_backward(
            grad_z, *ctx.saved_tensors
        )
        grad_residual = grad_z if ctx.has_residual else None
        return grad_x, grad_weight, grad_bias, None, None, None, None, grad_residual, None


class _Assemble(torch.autograd.Function):
    """A channel concatenation whose parts already lie in order in ``buffer``: the forward
    returns the buffer, the backward hands each part its slice of the gradient (views; no
    copy either way)."""

    @staticmethod
    def forward(ctx, buffer, *parts):
        ctx.widths = [p.shape[1] for p in parts]
        return _alias(buffer)

    @staticmethod
    def backward(ctx, grad):
        return None, *grad.split(ctx.widths, 1)


def _alias(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory as a tensor of its own to autograd, with its own version counter.

    The parts of a concatenation are written one after another into slices of one buffer,
    and each write counts as a change to the buffer (the op declares ``out`` mutated). A part
    returned as a view of the buffer would share the buffer's counter, so the next part's
    write would look like an in-place change under the earlier part's views (C2f splits its
    first part in two), which autograd refuses; and marking it dirty would make autograd copy
    the whole buffer in the backward. The slices never overlap, so no write changes memory
    that another part's alias sees."""
    alias = t.new_empty(0)
    return alias.set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def _lies_in(parts, buffer: torch.Tensor) -> bool:
    """Whether ``parts`` are, in order, views of ``buffer``'s channels that fill it."""
    first = 0
    for p in parts:
        width = p.shape[1]
        if first + width > buffer.shape[1]:
            return False
        slot = buffer[:, first : first + width]
        if p.dtype != buffer.dtype or p.shape != slot.shape or p.stride() != slot.stride():
            return False
        if p.data_ptr() != slot.data_ptr() or p.device != buffer.device:
            return False
        first += width
    return first == buffer.shape[1]
