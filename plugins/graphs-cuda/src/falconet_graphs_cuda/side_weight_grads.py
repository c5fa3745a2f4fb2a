"""The convolutions' weight gradients on a second stream, inside the captured step.

In a backward each convolution computes two gradients: its input's, which every layer before it
waits for, and its weight's, which nothing in the backward reads (only the update does). One
stream runs them in turn. Captured from two streams they become two branches of the CUDA
graph, and the GPU runs a weight gradient beside the input gradients that follow it: at small
batches these kernels are small and leave most of the GPU's SMs idle (their share of a
training pass, measured, is in docs/lab/2026-12-kernel-cost.md, ``wgrad_stream``). The kernels
are the same ones (cuDNN's, one call per gradient, as autograd makes them when only one is
needed), so the numbers are the same bit for bit (``tools/check_graphs.py`` compares
whole-step with eager on the GPU).

:class:`SideWeightGrads` is a function mode entered around the forward. Each ``conv2d`` whose
weight qualifies (:func:`_qualifies`) runs as the custom op ``falconet_graphs::conv2d``. Its
backward computes the input's and the bias's gradients on the current stream and the weight's
through ``falconet_graphs::conv2d_weight_grad``, on the side stream, and hands that gradient
on unfinished. Nothing may read a weight gradient before :meth:`SideWeightGrads.join`, which
makes the current stream wait for the side stream. That holds for a caller that takes the
gradients of leaves with ``torch.autograd.grad`` and joins before reading them, as the whole
step's ``micro`` does (with ``.backward()`` autograd may add into or copy a gradient on the
current stream). A weight used by two convolutions of one
forward has its two gradients added on the current stream, so its gradients stay there (the
forward op counts each weight's uses as it runs); so does a weight autocast would cast (the
cast's gradient reads it; the whole step passes weights already cast).

The side stream reads each convolution's input, weight and output gradient after autograd has
let go of them: the op holds them until :meth:`SideWeightGrads.join`, so the caching allocator
cannot give their memory to a later kernel of the current stream meanwhile.

The whole step uses it where the network runs on PyTorch's kernels, not where Inductor
compiles it (``fuse=inductor``, ``inductor-all``). ``torch.compile`` traces the mode and the
ops, but Inductor then compiles the graph around the opaque op into another fused step: not
bit for bit the one-stream fused step, and lower on the overfit check over three seeds
(docs/performance.md). And a compiled forward would need Inductor's own buffer reuse off
(``allow_buffer_reuse`` and ``inplace_buffers``), which reuses a dead buffer without the
allocator, under the side stream's reads.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.utils import _pair
from torch.overrides import TorchFunctionMode

CONV2D = (torch.conv2d, F.conv2d)

_active: SideWeightGrads | None = None  # the mode whose backward is running, until its join


class SideWeightGrads(TorchFunctionMode):
    """Within ``with``: the forward's qualifying convolutions, whose weight gradients the
    backward computes on ``stream`` (module docstring). Then :meth:`join`, once the gradients
    have been taken and before anything reads them."""

    def __init__(self, stream: torch.cuda.Stream | None) -> None:
        super().__init__()
        self.stream = stream  # None: the gradients are computed in turn (a CPU test)
        self.uses: dict[int, int] = {}  # weight address -> convolutions of this forward using it
        self.held: list[torch.Tensor] = []

    def __enter__(self) -> SideWeightGrads:
        global _active
        self.uses.clear()
        _active = self
        return super().__enter__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in CONV2D:
            return func(*args, **kwargs)
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
        bound = dict(zip(names, args, strict=False)) | kwargs
        if not _qualifies(bound):
            return func(*args, **kwargs)
        x, weight, bias = bound["input"], bound["weight"], bound.get("bias")
        if torch.is_autocast_enabled(x.device.type):  # autocast's casts, which it does not
            # make for a custom op (a weight that needed one did not qualify)
            x = x.to(weight.dtype)
            bias = None if bias is None else bias.to(weight.dtype)
        return torch.ops.falconet_graphs.conv2d(
            x,
            weight,
            bias,
            list(_pair(bound.get("stride", 1))),
            list(_pair(bound.get("padding", 0))),
            list(_pair(bound.get("dilation", 1))),
            int(bound.get("groups", 1)),
        )

    def weight_grad(self, weight: torch.Tensor, compute, reads: tuple[torch.Tensor, ...]):
        """``compute()`` on the side stream when ``weight`` was used once, holding what it
        ``reads`` until :meth:`join`; on the current stream otherwise."""
        if not self.runs_on_side(weight):
            return compute()
        self.held += reads
        current = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(current)  # the output gradient is ready
        with torch.cuda.stream(self.stream):
            grad = compute()
        grad.record_stream(current)  # read there after join; not reused by the side meanwhile
        return grad

    def runs_on_side(self, weight: torch.Tensor) -> bool:
        """Whether ``weight``'s gradient may run on the side stream: there is one, and one
        convolution of this forward used the weight (two gradients are added on the current
        stream, which would read them unfinished)."""
        return self.stream is not None and self.uses.get(weight.data_ptr(), 0) == 1

    def join(self) -> None:
        """Make the current stream wait for every weight gradient, then let go of what the
        side stream read."""
        global _active
        if self.stream is not None:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
        self.held.clear()
        if _active is self:
            _active = None


def _qualifies(bound: dict[str, Any]) -> bool:
    """A weight that is a leaf needing its gradient, in the dtype the convolution computes in,
    with numeric padding; a floating-point input."""
    x, weight = bound.get("input"), bound.get("weight")
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
        return False
    if not (weight.requires_grad and weight.is_leaf and x.is_floating_point()):
        return False
    if isinstance(bound.get("padding", 0), str) or weight.dim() != 4:
        return False
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return weight.dtype == torch.get_autocast_dtype(device)
    return weight.dtype == x.dtype


# ------------------------------------------------------------------------ the two ops
@torch.library.custom_op("falconet_graphs::conv2d", mutates_args=())
def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    """``F.conv2d``, counting the weight's uses in this forward (module docstring)."""
    if _active is not None:
        key = weight.data_ptr()
        _active.uses[key] = _active.uses.get(key, 0) + 1
    return F.conv2d(x, weight, bias, stride, padding, dilation, groups)


@conv2d.register_fake
def _(x, weight, bias, stride, padding, dilation, groups):
    return F.conv2d(x, weight, bias, stride, padding, dilation, groups)


@torch.library.custom_op("falconet_graphs::conv2d_weight_grad", mutates_args=())
def conv2d_weight_grad(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    """The weight's gradient, on the side stream of the active mode where it may run there,
    in the weight's strides (as the op's fake says)."""

    def compute() -> torch.Tensor:
        geometry = (stride, padding, dilation, groups)
        mask = [False, True, False]
        grad = _convolution_backward(grad_output, x, weight, geometry, None, mask)[1]
        if grad.stride() != weight.stride():
            grad = torch.empty_like(weight).copy_(grad)
        return grad

    side = _active
    if side is None:
        return compute()
    return side.weight_grad(weight, compute, reads=(grad_output, x, weight))


@conv2d_weight_grad.register_fake
def _(grad_output, x, weight, stride, padding, dilation, groups):
    return torch.empty_like(weight)


def _convolution_backward(grad_output, x, weight, geometry, bias_sizes, mask):
    """ATen's convolution backward for the gradients ``mask`` asks for (input, weight, bias):
    cuDNN's kernel for each, as autograd calls it."""
    stride, padding, dilation, groups = geometry
    return torch.ops.aten.convolution_backward(
        grad_output, x, weight, bias_sizes, stride, padding, dilation, False, [0, 0], groups, mask
    )


def _setup(ctx, inputs, output) -> None:
    x, weight, bias, stride, padding, dilation, groups = inputs
    ctx.save_for_backward(x, weight)
    ctx.geometry = (stride, padding, dilation, groups)
    ctx.has_bias = bias is not None


def _backward(ctx, grad_output):
    x, weight = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.geometry
    needs_x, needs_w, needs_b = ctx.needs_input_grad[:3]
    grad_x = grad_w = grad_b = None
    if needs_x or needs_b:
        bias_sizes = [weight.shape[0]] if ctx.has_bias else None
        grad_x, _, grad_b = _convolution_backward(
            grad_output, x, weight, ctx.geometry, bias_sizes, [needs_x, False, needs_b]
        )
    if needs_w:
        grad_w = torch.ops.falconet_graphs.conv2d_weight_grad(
            grad_output, x, weight, stride, padding, dilation, groups
        )
    return grad_x, grad_w, grad_b, None, None, None, None


conv2d.register_autograd(_backward, setup_context=_setup)
