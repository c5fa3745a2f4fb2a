"""The ``compile`` graph backend: when it declines, what it does when compiling fails, and
that a compiled network computes what the eager one does (CPU Inductor)."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from torch import nn

from falconet.compile_dispatch import CompileDispatch
from falconet.interfaces import DispatchContext


def _context(device="cpu", region=True, **options) -> DispatchContext:
    return DispatchContext(
        torch.device(device),
        "fp32",
        capture_region=nn.Identity() if region else None,
        options=options,
    )


def test_declines_with_a_reason():
    backend = CompileDispatch()
    assert "no capture region" in backend.decline_reason(_context(region=False))
    reason = backend.decline_reason(_context(compile_mode="reduce-overhead"))
    assert "needs a CUDA device" in reason
    assert "not one of" in backend.decline_reason(_context(compile_mode="fast"))


def test_a_failed_compile_is_logged_and_the_call_runs_eager(caplog):
    """A real Inductor failure: the C++ compiler it is told to use does not exist."""
    import torch._inductor.config as inductor_config

    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.SiLU())
    x = torch.rand(1, 3, 8, 8)
    with (
        inductor_config.patch({"cpp.cxx": ("/nonexistent/c++",)}),
        caplog.at_level(logging.ERROR, logger="falconet.train"),
    ):
        wrapped = CompileDispatch().wrap(net, _context())
        out = wrapped(x)
    torch.testing.assert_close(out, net(x))
    assert "failed to compile the network: InductorError" in caplog.text
    assert "/nonexistent/c++" in caplog.text and "continues with graph=eager" in caplog.text
    assert wrapped.failed is not None
    torch.testing.assert_close(wrapped(x), net(x))  # eager from then on


@pytest.mark.skipif(not shutil.which("c++"), reason="CPU Inductor needs a C++ compiler")
def test_compiled_network_matches_eager_forward_and_backward():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU())
    x = torch.rand(2, 3, 16, 16)
    probe = torch.randn(2, 8, 16, 16)  # a loss whose gradient does not vanish through BN
    wrapped = CompileDispatch().wrap(net, _context())
    eager_out = net(x)
    (eager_out * probe).sum().backward()
    eager_grad = net[0].weight.grad.clone()
    net.zero_grad()
    compiled_out = wrapped(x)
    (compiled_out * probe).sum().backward()
    assert wrapped.failed is None
    torch.testing.assert_close(compiled_out, eager_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(net[0].weight.grad, eager_grad, rtol=1e-3, atol=1e-3)
