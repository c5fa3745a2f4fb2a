"""The ``compile`` graph backend: its key, when it declines, the step it builds, what it does
when compiling fails, that a compiled network computes what the eager one does (CPU Inductor),
and the gradient copy that gradient accumulation needs under CUDA graph trees."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from torch import nn

from falconet.contract import CaptureStats, GraphContext, Progress, StepParts
from falconet.graph_backends.compile import (
    CompileBackend,
    CompiledNetwork,
    CompileKeys,
    own_grads,
)
from falconet.graph_backends.eager_step import EagerStep
from falconet.plugins import Plugins
from falconet.precision import BF16, FP32
from falconet.training.config import ConfigError, TrainConfig, build_config, config_model
from falconet.training.optimization import Schedule
from falconet.training.phases import Phases


def _context(device="cpu", region=True, precision=FP32, **keys) -> GraphContext:
    return GraphContext(
        torch.device(device),
        precision,
        capture_region=nn.Identity() if region else None,
        config=CompileKeys(**keys),
    )


def _parts(model: nn.Module) -> StepParts:
    cfg = build_config(TrainConfig, {"epochs": 1})
    return StepParts(
        model=model,
        loss=lambda outputs, targets: (outputs.float().pow(2).mean(), {}),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        precision=FP32,
        scaler=None,
        ema=None,
        clip_grad=0.0,
        loss_gain=1.0,
        schedule=Schedule(cfg, 1),
        progress=Progress(),
        phases=Phases(),
        device=torch.device("cpu"),
    )


def test_compile_mode_is_the_backends_own_key():
    model = config_model(Plugins(env={}).load_builtins())
    assert "compile_mode" not in TrainConfig.model_fields  # the core's keys do not name it
    assert build_config(model, {"compile_mode": "reduce-overhead"}).compile_mode == (
        "reduce-overhead"
    )
    assert build_config(model).compile_mode == "default"
    with pytest.raises(
        ConfigError, match="compile_mode='fast': expected 'default', 'reduce-overhead' or"
    ):
        build_config(model, {"compile_mode": "fast"})


def test_declines_with_a_reason():
    backend = CompileBackend()
    assert backend.priority is None  # never chosen by graph=auto
    assert "no capture region" in backend.decline_reason(_context(region=False))
    reason = backend.decline_reason(_context(compile_mode="reduce-overhead"))
    assert "needs a CUDA device" in reason
    if any(map(shutil.which, ("c++", "g++", "clang++"))):  # else that is the reason given
        assert "use amp_dtype=fp32" in backend.decline_reason(_context(precision=BF16))
        assert backend.decline_reason(_context(precision=FP32)) is None


def test_builds_an_eager_step_around_the_compiled_network():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.SiLU())
    parts = _parts(net)
    step = CompileBackend().build_step(parts, _context(compile_mode="max-autotune-no-cudagraphs"))
    assert isinstance(step, EagerStep) and step.parts is parts
    assert isinstance(step.network, CompiledNetwork) and step.network.network is net
    assert step.network.mode == "max-autotune-no-cudagraphs" and not step.network.mark_step
    assert step.stats() == CaptureStats()  # nothing tried yet


def test_a_failed_compile_is_logged_and_the_call_runs_eager(caplog):
    """A real Inductor failure: the C++ compiler it is told to use does not exist."""
    import torch._inductor.config as inductor_config

    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.SiLU())
    x = torch.rand(1, 3, 8, 8)
    with (
        inductor_config.patch({"cpp.cxx": ("/nonexistent/c++",)}),
        caplog.at_level(logging.ERROR, logger="falconet.train"),
    ):
        step = CompileBackend().build_step(_parts(net), _context())
        wrapped = step.network
        out = wrapped(x)
    torch.testing.assert_close(out, net(x))
    assert "failed to compile the network: InductorError" in caplog.text
    assert "/nonexistent/c++" in caplog.text and "continues with graph=eager" in caplog.text
    assert wrapped.failed is not None
    assert step.stats() == CaptureStats(failed=1)  # the step reports the failed capture
    torch.testing.assert_close(wrapped(x), net(x))  # eager from then on


@pytest.mark.skipif(not shutil.which("c++"), reason="CPU Inductor needs a C++ compiler")
def test_compiled_network_matches_eager_forward_and_backward():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU())
    x = torch.rand(2, 3, 16, 16)
    probe = torch.randn(2, 8, 16, 16)  # a loss whose gradient does not vanish through BN
    wrapped = CompiledNetwork(net, "default")
    eager_out = net(x)
    (eager_out * probe).sum().backward()
    eager_grad = net[0].weight.grad.clone()
    net.zero_grad()
    compiled_out = wrapped(x)
    (compiled_out * probe).sum().backward()
    assert wrapped.failed is None
    torch.testing.assert_close(compiled_out, eager_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(net[0].weight.grad, eager_grad, rtol=1e-3, atol=1e-3)


class StaticBackward(torch.autograd.Function):
    """``x * w`` whose backward writes the weight's gradient into one buffer and returns it,
    as a CUDA graph's replay does (a fresh tensor on that storage, so autograd takes it as
    ``w.grad`` rather than copying it)."""

    buffer: torch.Tensor

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x)
        return x * w

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        StaticBackward.buffer.copy_((grad * x).sum(0))
        return None, StaticBackward.buffer.detach()


@pytest.mark.parametrize("copy", [True, False], ids=["own_grads", "without"])
def test_accumulated_gradients_survive_the_next_replay_only_with_own_grads(copy):
    """Two microbatches into one ``w.grad`` from ``None``: g0 + g1; without the copy the
    second replay overwrites the first's gradient and the sum is 2 x g1."""
    w = torch.ones(3, requires_grad=True)
    StaticBackward.buffer = torch.zeros(3)
    x0, x1 = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[10.0, 20.0, 30.0]])
    owned: set[int] = set()
    for x in (x0, x1):
        if copy:
            owned = own_grads([w], owned)
        StaticBackward.apply(x, w).sum().backward()
    expected = x0[0] + x1[0] if copy else 2 * x1[0]
    assert torch.equal(w.grad, expected)


def test_own_grads_copies_a_gradient_once_per_accumulation():
    w = torch.ones(3, requires_grad=True)
    w.grad = stolen = torch.zeros(3)
    owned = own_grads([w], set())
    assert w.grad is not stolen and owned == {w.grad.data_ptr()}
    copy = w.grad
    assert own_grads([w], owned) == owned and w.grad is copy  # accumulated in place: kept
    w.grad = None  # zero_grad(set_to_none=True)
    assert own_grads([w], owned) == set()


def test_compile_declines_under_ddp():
    """The compiled module would call the model, not DDP's wrapper, and skip the all-reduce."""
    reason = CompileBackend().decline_reason(
        GraphContext(torch.device("cpu"), FP32, world_size=2, capture_region=torch.nn.Linear(1, 1))
    )
    assert reason is not None and "DDP" in reason
