"""The side-stream weight gradients' logic on the CPU: the custom convolution op gives the
same outputs and gradients bit for bit as PyTorch's, eagerly, under autocast and traced by
``torch.compile``; it counts each weight's uses; only a weight used once would go to the side
stream. That the second stream keeps the numbers on a GPU is ``tools/check_graphs.py``'s job
(whole-step against eager, bit for bit)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from falconet_graphs_cuda import side_weight_grads
from falconet_graphs_cuda.keys import GraphsCudaKeys
from falconet_graphs_cuda.side_weight_grads import SideWeightGrads
from falconet_graphs_cuda.step_modes import side_stream_applies


class Shared(nn.Module):
    """Strided, grouped and biased convolutions, one of them called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, 2, 1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.b = nn.Conv2d(8, 8, 3, 1, 1, groups=2)
        self.c = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b(nn.functional.silu(self.bn(self.a(x))))
        return self.c(y) + self.c(y * 0.5)


def _net_and_images() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    net = Shared().to(memory_format=torch.channels_last)
    images = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
    return net, images


def _pass(net, images, mode, *, dtype=None, forward=None, cast=True):
    """Forward and ``autograd.grad`` of every leaf, as the whole step takes them: under
    autocast the convolutions get leaves already in ``dtype`` (unless not ``cast``)."""
    leaves = {n: p.detach().clone().requires_grad_() for n, p in net.named_parameters()}
    if dtype is not None and cast:
        for name in ("a.weight", "b.weight", "b.bias", "c.weight", "c.bias"):
            leaves[name] = leaves[name].detach().to(dtype).requires_grad_()
    forward = forward or (lambda leaves, x: functional_call(net, leaves, (x,)))
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        if mode is None:
            out = forward(leaves, images)
        else:
            with mode:
                out = forward(leaves, images)
    grads = torch.autograd.grad(out.float().square().sum(), list(leaves.values()))
    if mode is not None:
        mode.join()
    return out, grads


def _assert_same(first, second, *, strides: bool = True) -> None:
    (out_a, grads_a), (out_b, grads_b) = first, second
    assert torch.equal(out_a, out_b)
    assert len(grads_a) == len(grads_b) == 7
    for a, b in zip(grads_a, grads_b, strict=True):
        assert a.dtype == b.dtype and (a.stride() == b.stride() or not strides)
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16-autocast"])
def test_the_op_is_pytorchs_convolution_bit_for_bit(dtype):
    net, images = _net_and_images()
    mode = SideWeightGrads(stream=None)
    _assert_same(_pass(net, images, None, dtype=dtype), _pass(net, images, mode, dtype=dtype))
    # every convolution went through the op: c's weight twice, the others once
    assert sorted(mode.uses.values()) == [1, 1, 2]
    assert mode.held == [] and side_weight_grads._active is None  # join let go


def test_a_weight_autocast_would_cast_keeps_pytorchs_convolution():
    """An fp32 weight under bf16 autocast: its cast's gradient would read the weight gradient
    on the current stream, so the convolution is left to PyTorch (no use counted)."""
    net, images = _net_and_images()
    mode = SideWeightGrads(stream=None)
    plain = _pass(net, images, None, dtype=torch.bfloat16, cast=False)
    _assert_same(plain, _pass(net, images, mode, dtype=torch.bfloat16, cast=False))
    assert mode.uses == {}


def test_only_a_weight_used_once_goes_to_the_side_stream():
    net, images = _net_and_images()
    mode = SideWeightGrads(stream=None)
    leaves = {n: p.detach().clone().requires_grad_() for n, p in net.named_parameters()}
    with mode:
        functional_call(net, leaves, (images,))
    assert not mode.runs_on_side(leaves["a.weight"])  # no stream: everything in turn
    mode.stream = object()  # stands for a CUDA stream: only the decision is read
    assert mode.runs_on_side(leaves["a.weight"]) and mode.runs_on_side(leaves["b.weight"])
    assert not mode.runs_on_side(leaves["c.weight"])  # used twice: added on the current stream
    mode.stream = None
    mode.join()


def test_compiled_through_the_mode_is_the_same_pass():
    """``torch.compile`` traces the mode and the op (its backward included): the same numbers
    as the op run eagerly, and the op counts the uses at run time."""
    net, images = _net_and_images()

    def forward(leaves, x):
        return functional_call(net, leaves, (x,))

    compiled = torch.compile(forward, backend="aot_eager", dynamic=False)
    eager_mode, compiled_mode = SideWeightGrads(None), SideWeightGrads(None)
    _assert_same(
        _pass(net, images, eager_mode),
        _pass(net, images, compiled_mode, forward=compiled),
        strides=False,  # c's two gradients, added in the graph: a 1x1 weight's other strides
    )
    assert sorted(compiled_mode.uses.values()) == [1, 1, 2]


@pytest.mark.parametrize(
    ("keys", "device", "applies"),
    [
        ({}, "cuda", True),  # the default
        ({"fuse": "inductor-loss"}, "cuda", True),  # the network still runs on PyTorch's
        ({"fuse": "inductor"}, "cuda", False),  # a compiled network keeps one stream
        ({"fuse": "inductor-all"}, "cuda", False),
        ({"wgrad_stream": False}, "cuda", False),
        ({}, "cpu", False),
    ],
)
def test_where_the_whole_step_uses_the_second_stream(keys, device, applies):
    assert side_stream_applies(GraphsCudaKeys(**keys), torch.device(device)) is applies
