"""BatchNorm and SiLU as one op on Triton kernels, for the whole step (``bn_silu=triton``).

With the launches gone, BatchNorm and SiLU are the largest kernel cost of a small detector's
step (docs/performance.md): PyTorch runs cuDNN's BatchNorm (its native kernels in bf16), then
SiLU apart: six kernels and about thirteen passes over the activation a layer, forward and
backward. The op ``falconet_graphs::bn_silu`` does it in six kernels and eight passes
(:mod:`falconet_graphs_cuda.bn_silu_kernels`). Its numbers agree with PyTorch's to rounding,
not bit for bit (other reductions), so it is an opt-in whose accuracy the overfit check
measures.

:class:`FusedBatchNormSiLU` is the function mode the whole step enters around the forward:
it answers for :func:`falconet.ops.batch_norm_silu` when the BatchNorm trains with running
statistics and a momentum and the input is a dense channels-last (or NCHW with one pixel)
tensor on the GPU; anything else runs as the family wrote it. Evaluation, where BatchNorm
uses its running statistics, never comes here.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from falconet import ops

ELEMENTS = 4096  # elements of one program's tile; 4 warps hold it in registers
PROGRAMS_PER_SM = 4  # the reductions' row programs, per SM and channel block


class FusedBatchNormSiLU(TorchFunctionMode):
    """Within ``with``: :func:`falconet.ops.batch_norm_silu` on the fused op where it
    qualifies (module docstring). ``interpret``: qualify CPU tensors too, for Triton's
    interpreter (``TRITON_INTERPRET=1``, the CPU tests)."""

    def __init__(self, interpret: bool = False) -> None:
        super().__init__()
        self.interpret = interpret

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not ops.batch_norm_silu or not self._qualifies(*args, **kwargs):
            return func(*args, **kwargs)
        x, bn = args
        z = _BatchNormSiLU.apply(
            x, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum, bn.eps
        )
        if bn.num_batches_tracked is not None:  # the whole step passes None (it counts)
            bn.num_batches_tracked.add_(1)
        return z

    def _qualifies(self, x: torch.Tensor, bn: nn.Module) -> bool:
        if not (isinstance(bn, nn.BatchNorm2d) and bn.training and bn.affine):
            return False
        if bn.running_mean is None or bn.momentum is None:
            return False
        if x.device.type != "cuda" and not self.interpret:
            return False
        if x.dim() != 4 or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return False
        stats = (bn.weight, bn.bias, bn.running_mean, bn.running_var)
        if any(t.dtype != torch.float32 or not t.is_contiguous() for t in stats):
            return False
        return x.is_contiguous(memory_format=torch.channels_last) and x.numel() > 0


# --------------------------------------------------------------------------- launch plan
@functools.cache
def _programs(device: torch.device) -> int:
    """Row programs a reduction aims at: a few per SM, so every SM has work."""
    if device.type != "cuda":
        return 8
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def _plan(x: torch.Tensor) -> tuple[int, int, int, int, int]:
    """Rows, channels, channel block, row block, and the rows each reduction program takes
    (a whole number of row blocks)."""
    channels = x.shape[1]
    rows = x.numel() // channels
    block_c = min(64, max(16, 1 << (channels - 1).bit_length()))
    block_r = ELEMENTS // block_c
    channel_blocks = -(-channels // block_c)
    target = max(1, _programs(x.device) // channel_blocks)
    per_program = -(-rows // target)
    per_program = block_r * -(-per_program // block_r)
    return rows, channels, block_c, block_r, per_program


def _grids(rows: int, channels: int, block_c: int, block_r: int, per_program: int):
    channel_blocks = -(-channels // block_c)
    programs = -(-rows // per_program)
    return programs, (programs, channel_blocks), (-(-rows // block_r), channel_blocks)


# --------------------------------------------------------------------------- the ops
@torch.library.custom_op("falconet_graphs::bn_silu", mutates_args=("running_mean", "running_var"))
def bn_silu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    momentum: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``silu(batch_norm(x))`` with the batch's statistics, the running ones updated; returns
    the output, the batch's mean and its 1/std (what the backward reads)."""
    from falconet_graphs_cuda import bn_silu_kernels as k

    rows, channels, block_c, block_r, per_program = _plan(x)
    programs, reduce_grid, map_grid = _grids(rows, channels, block_c, block_r, per_program)
    partial_mean = x.new_empty((programs, channels), dtype=torch.float32)
    partial_m2 = torch.empty_like(partial_mean)
    mean = x.new_empty(channels, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    z = torch.empty_like(x, memory_format=torch.channels_last)
    k.stats_partial[reduce_grid](
        x, partial_mean, partial_m2, rows, channels, per_program, BLOCK_R=block_r, BLOCK_C=block_c
    )
    k.stats_final[(reduce_grid[1],)](
        partial_mean, partial_m2, mean, rstd, running_mean, running_var,
        rows, channels, per_program, programs, momentum, eps,
        BLOCK_P=block_r, BLOCK_C=block_c,
    )  # fmt: skip
    k.normalise_silu[map_grid](
        x, z, mean, rstd, weight, bias, rows, channels, BLOCK_R=block_r, BLOCK_C=block_c
    )
    return z, mean, rstd


@bn_silu.register_fake
def _(x, weight, bias, running_mean, running_var, momentum, eps):
    mean = x.new_empty(x.shape[1], dtype=torch.float32)
    return torch.empty_like(x, memory_format=torch.channels_last), mean, torch.empty_like(mean)


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
    rows, channels, block_c, block_r, per_program = _plan(x)
    programs, reduce_grid, map_grid = _grids(rows, channels, block_c, block_r, per_program)
    partial_dy = x.new_empty((programs, channels), dtype=torch.float32)
    partial_dy_xhat = torch.empty_like(partial_dy)
    grad_bias = torch.empty_like(bias)
    grad_weight = torch.empty_like(weight)
    grad_x = torch.empty_like(x, memory_format=torch.channels_last)
    k.grad_partial[reduce_grid](
        grad_z, x, mean, rstd, weight, bias, partial_dy, partial_dy_xhat,
        rows, channels, per_program, BLOCK_R=block_r, BLOCK_C=block_c,
    )  # fmt: skip
    k.grad_final[(reduce_grid[1],)](
        partial_dy, partial_dy_xhat, grad_bias, grad_weight, channels, programs,
        BLOCK_P=block_r, BLOCK_C=block_c,
    )  # fmt: skip
    k.grad_input[map_grid](
        grad_z, x, grad_x, mean, rstd, weight, bias, grad_bias, grad_weight, rows, channels,
        BLOCK_R=block_r, BLOCK_C=block_c,
    )  # fmt: skip
    return grad_x, grad_weight, grad_bias


@bn_silu_backward.register_fake
def _(grad_z, x, weight, bias, mean, rstd):
    grad_x = torch.empty_like(x, memory_format=torch.channels_last)
    return grad_x, torch.empty_like(weight), torch.empty_like(bias)


class _BatchNormSiLU(torch.autograd.Function):
    """Autograd for the pair of ops (a custom op that updates the running statistics in place
    cannot carry an autograd formula of its own)."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
        z, mean, rstd = torch.ops.falconet_graphs.bn_silu(
            x, weight, bias, running_mean, running_var, momentum, eps
        )
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return z

    @staticmethod
    def backward(ctx, grad_z):
        grad_x, grad_weight, grad_bias = torch.ops.falconet_graphs.bn_silu_backward(
            grad_z, *ctx.saved_tensors
        )
        return grad_x, grad_weight, grad_bias, None, None, None, None
