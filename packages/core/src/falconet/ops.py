"""Ops a family's network calls where a layout or kernel choice matters, which a backend may
replace with its own kernels.

A family writes the math with these ops, and run as is each computes exactly that on
PyTorch's own kernels (ATen, cuDNN), with the copies that pay there placed inside the op:

* :func:`batch_norm_silu`: ``silu(bn(x))`` (plus a residual), the end of a conv block;
* :class:`ChannelConcat` and :func:`concat_channels`: a channel concatenation declared before
  its parts are made, so that a backend may have the parts written into one buffer;
* :func:`dense`: a tensor as a convolution reads it best (a channel slice copied once);
* :func:`max_pool_chain`: max-pools applied one after another;
* :func:`dense_grad`: the identity, whose gradient comes back dense.

Under ``torch.compile`` Inductor writes the kernels and picks layouts itself, and the copies
placed for PyTorch's kernels were measured to cost there (docs/performance.md), so a compiled
network traces each op as its plain formula (:func:`eager_kernels`).

Each op goes through torch's function-mode protocol (:func:`torch.overrides.
handle_torch_function`), so a backend replaces it for the duration of a ``with`` block by
entering a :class:`torch.overrides.TorchFunctionMode` that answers for it, with no change to
the family and no registry: a whole-step backend may do so with a fused kernel that writes each
part of a :class:`ChannelConcat` in place. A mode
that does not know an op calls it through, as modes do for every torch function.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import handle_torch_function, has_torch_function


def eager_kernels() -> bool:
    """Whether this forward runs on PyTorch's own kernels, for which the ops' copies were
    measured to pay (not under ``torch.compile``, where Inductor picks the layouts)."""
    return not torch.compiler.is_compiling()


class ChannelConcat:
    """A concatenation along channels, ``channels`` wide, declared before its parts exist.

    ``part(width)`` names the next ``width`` channels: a producer given it as ``out``
    (:func:`batch_norm_silu`) may write its result there, and :func:`concat_channels` then
    finds the parts in place. ``buffer`` is ``[B, channels, H, W]`` once a backend has made
    it (on the first write it takes), else None: run as is there is never a buffer, and the
    parts are concatenated by copying.
    """

    def __init__(self, channels: int) -> None:
        self.channels = channels
        self.buffer: torch.Tensor | None = None
        self._taken = 0

    def part(self, width: int) -> ConcatPart:
        """The next ``width`` channels of the concatenation."""
        if self._taken + width > self.channels:
            raise ValueError(f"{self._taken} + {width} channels exceed {self.channels}")
        self._taken += width
        return ConcatPart(self, self._taken - width, width)

    def __call__(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """``torch.cat(parts, 1)`` (:func:`concat_channels`)."""
        return concat_channels(parts, self)


@dataclass(frozen=True, eq=False)
class ConcatPart:
    """Channels ``[first, first + width)`` of ``concat``: where a producer may write."""

    concat: ChannelConcat
    first: int
    width: int


def batch_norm_silu(
    x: torch.Tensor,
    bn: nn.Module,
    residual: torch.Tensor | None = None,
    out: ConcatPart | None = None,
) -> torch.Tensor:
    """``silu(bn(x))`` for ``x [B, C, H, W]``: a BatchNorm module, then SiLU, out of place;
    plus ``residual`` (``[B, C, H, W]``) when one is given (``residual + silu(bn(x))``, a
    residual block's end).

    The SiLU is out of place: its backward reads its input, so under autograd an in-place SiLU
    first copies the BatchNorm output it overwrites. ``out``: the part of a
    :class:`ChannelConcat` this result joins, where a backend may write it; run as is it is
    not used."""
    if has_torch_function((x,)):
        return handle_torch_function(batch_norm_silu, (x,), x, bn, residual, out)
    y = F.silu(bn(x))
    return y if residual is None else residual + y


def concat_channels(
    parts: Sequence[torch.Tensor], concat: ChannelConcat | None = None
) -> torch.Tensor:
    """``torch.cat(parts, 1)`` of ``[B, C_i, H, W]`` parts. A backend that made ``concat``'s
    buffer returns it without a copy when every part already lies in it, in order."""
    if has_torch_function(tuple(parts)):
        return handle_torch_function(concat_channels, tuple(parts), parts, concat)
    return torch.cat(tuple(parts), 1)


def dense(x: torch.Tensor) -> torch.Tensor:
    """``x [B, C, H, W]``, copied if it is a slice of channels (a strided view).

    A convolution (cuDNN) copies such a view densely for its forward and again for its
    weight's gradient (autograd keeps the view); copied here once, the copy is what the
    backward keeps: the same values and gradients bit for bit (docs/performance.md). Give the
    copy to every reader of ``x`` (the concatenation too), so gradients add up in the order
    they would without it. Under ``torch.compile``: ``x``."""
    if has_torch_function((x,)):
        return handle_torch_function(dense, (x,), x)
    if not eager_kernels() or x.is_contiguous():
        return x
    if x.is_contiguous(memory_format=torch.channels_last):
        return x
    return x.clone(memory_format=torch.preserve_format)


def max_pool_chain(x: torch.Tensor, pool: nn.Module, count: int) -> list[torch.Tensor]:
    """``[pool(x), pool(pool(x)), ...]``, ``count`` maps ``[B, C, H', W']`` in ``x``'s layout.

    On PyTorch's kernels the pools run in the contiguous (NCHW) layout whatever ``x``'s:
    its channels-last max-pool kernels are slow on small maps, and the contiguous ones with
    the conversions there and back cost less (docs/performance.md). The maxima are the same in
    either layout, and so are the winners of ties: the same numbers and gradients bit for
    bit. Under ``torch.compile`` they pool in ``x``'s layout."""
    if has_torch_function((x,)):
        return handle_torch_function(max_pool_chain, (x,), x, pool, count)
    if not eager_kernels():
        maps = [pool(x)]
        for _ in range(count - 1):
            maps.append(pool(maps[-1]))
        return maps
    maps = [pool(x.contiguous())]
    for _ in range(count - 1):
        maps.append(pool(maps[-1]))
    layout = _layout(x)  # back to x's layout, so a concatenation with x is one batched copy
    return [m.contiguous(memory_format=layout) for m in maps]


def dense_grad(x: torch.Tensor) -> torch.Tensor:
    """The identity on ``x [B, C, H, W]``, whose gradient is made dense in ``x``'s layout.

    A tensor whose gradient comes back as a strided slice (a level's from the concatenation
    over cells) makes a convolution's backward copy it dense twice, once for the input's
    gradient and once for the weight's: one copy here instead (the same numbers bit for
    bit). Under ``torch.compile``, and without gradients: ``x``."""
    if has_torch_function((x,)):
        return handle_torch_function(dense_grad, (x,), x)
    if not (x.requires_grad and eager_kernels()):
        return x
    return _DenseGrad.apply(x)


class _DenseGrad(torch.autograd.Function):
    """:func:`dense_grad`'s autograd: the identity forward, a dense gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.layout = _layout(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous(memory_format=ctx.layout)


def _layout(x: torch.Tensor) -> torch.memory_format:
    """The memory format ``x`` is dense in: channels-last or contiguous."""
    if x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


_RANK_LOCAL = threading.local()  # .on inside rank_local(), on the thread that entered it


@contextlib.contextmanager
def rank_local() -> Iterator[None]:
    """Inside, :func:`rank_sum` and :func:`world_size` see this process alone: for a step one
    rank runs while the others wait (autobatch's probe on rank 0), where a collective would
    meet another collective on the other ranks, and for the start-up's copy of the network
    (:mod:`falconet.training.first_use`). It holds for the thread that entered it alone:
    the training thread's losses still see every rank meanwhile."""
    outer = getattr(_RANK_LOCAL, "on", False)
    _RANK_LOCAL.on = True
    try:
        yield
    finally:
        _RANK_LOCAL.on = outer


def rank_sum(x: torch.Tensor) -> torch.Tensor:
    """``x`` summed over the ranks of a distributed run (``x`` itself in one process), with no
    gradient: for a loss's normaliser that depends on the batch's content (a count of
    positives, a sum of soft targets), so that each rank divides by the global batch's value
    (:mod:`falconet.training.distributed`)."""
    import torch.distributed as dist

    if world_size() == 1:
        return x
    total = x.detach().clone()
    dist.all_reduce(total)
    return total


def world_size() -> int:
    """The number of ranks training together (1 outside a distributed run, and inside
    :func:`rank_local`)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and not getattr(_RANK_LOCAL, "on", False):
        return dist.get_world_size()
    return 1
