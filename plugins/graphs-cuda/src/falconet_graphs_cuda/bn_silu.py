"""BatchNorm and SiLU as one op on Triton kernels, for the whole step (``bn_silu=triton``).

With the launches gone, BatchNorm and SiLU are the largest kernel cost of a small detector's
step (docs/performance.md): PyTorch runs cuDNN's BatchNorm, then SiLU apart, six
kernels and thirteen passes over the activation a layer, forward and backward. The op
``falconet_graphs::bn_silu`` does it in four kernels and eight passes
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
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from falconet import ops

ELEMENTS = 4096  # elements of an elementwise program's tile; 4 warps hold it in registers
REDUCE_ELEMENTS = 2048  # a reduction's tile: it keeps two float32 accumulators of that size
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


@dataclass(frozen=True)
class _Plan:
    """How a ``[rows, channels]`` activation is cut: channel blocks of ``block_c``; the
    elementwise kernels' row tiles of ``block_r``; the reductions' tiles of ``reduce_r`` rows,
    ``per_program`` rows (a whole number of tiles) to each of ``programs`` row programs."""

    rows: int
    channels: int
    block_c: int
    block_r: int
    reduce_r: int
    per_program: int

    @property
    def programs(self) -> int:
        return -(-self.rows // self.per_program)

    @property
    def reduce_grid(self) -> tuple[int, int]:
        return self.programs, -(-self.channels // self.block_c)

    @property
    def map_grid(self) -> tuple[int, int]:
        return -(-self.rows // self.block_r), self.reduce_grid[1]


def _plan(x: torch.Tensor) -> _Plan:
    channels = x.shape[1]
    rows = x.numel() // channels
    block_c = min(64, max(16, 1 << (channels - 1).bit_length()))
    reduce_r = REDUCE_ELEMENTS // block_c
    target = max(1, _programs(x.device) // -(-channels // block_c))
    per_program = reduce_r * math.ceil(math.ceil(rows / target) / reduce_r)
    return _Plan(rows, channels, block_c, ELEMENTS // block_c, reduce_r, per_program)


COUNTER_SLOTS = 4096  # channel blocks a reduction may have (262,144 channels)


@functools.cache
def _counters(device: torch.device, kind: str) -> torch.Tensor:
    """The reductions' finish counters on ``device`` (``kind``: forward or backward), zeros
    that each reduction's last program resets. Made on the first call, which must not be
    inside a CUDA graph capture (the whole step runs eagerly before it records)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "bn_silu=triton: the fused op's first call is inside a CUDA graph capture; run a "
            "step eagerly first (the whole step does)"
        )
    return torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)


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

    plan = _plan(x)
    if plan.reduce_grid[1] > COUNTER_SLOTS:
        raise ValueError(f"bn_silu=triton takes at most {COUNTER_SLOTS * plan.block_c} channels")
    partial_mean = x.new_empty((plan.programs, plan.channels), dtype=torch.float32)
    partial_m2 = torch.empty_like(partial_mean)
    mean = x.new_empty(plan.channels, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    z = torch.empty_like(x, memory_format=torch.channels_last)
    k.stats[plan.reduce_grid](
        x, partial_mean, partial_m2, _counters(x.device, "forward"), mean, rstd, running_mean,
        running_var, plan.rows, plan.channels, plan.per_program, plan.programs, momentum, eps,
        BLOCK_R=plan.reduce_r, BLOCK_C=plan.block_c,
    )  # fmt: skip
    k.normalise_silu[plan.map_grid](
        x, z, mean, rstd, weight, bias, plan.rows, plan.channels,
        BLOCK_R=plan.block_r, BLOCK_C=plan.block_c,
    )  # fmt: skip
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
    plan = _plan(x)
    partial_dy = x.new_empty((plan.programs, plan.channels), dtype=torch.float32)
    partial_dy_xhat = torch.empty_like(partial_dy)
    grad_bias = torch.empty_like(bias)
    grad_weight = torch.empty_like(weight)
    grad_x = torch.empty_like(x, memory_format=torch.channels_last)
    k.grad_sums[plan.reduce_grid](
        grad_z, x, mean, rstd, weight, bias, partial_dy, partial_dy_xhat,
        _counters(x.device, "backward"), grad_bias, grad_weight, plan.rows, plan.channels,
        plan.per_program, plan.programs, BLOCK_R=plan.reduce_r, BLOCK_C=plan.block_c,
    )  # fmt: skip
    k.grad_input[plan.map_grid](
        grad_z, x, grad_x, mean, rstd, weight, bias, grad_bias, grad_weight, plan.rows,
        plan.channels, BLOCK_R=plan.block_r, BLOCK_C=plan.block_c,
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
