"""The built-in precision backends against the precision contract suite."""

from __future__ import annotations

import pytest
import torch

from falconet.loss_scaler import LossScaler
from falconet.precision import BF16, FP16, FP32
from falconet_testing.contracts import PrecisionBackendContract


class TestFP32(PrecisionBackendContract):
    backend = FP32


class TestFP16(PrecisionBackendContract):
    backend = FP16


class TestBF16(PrecisionBackendContract):
    backend = BF16


def test_fp16_on_cpu_says_what_to_use_instead():
    reason = FP16.unavailable_reason(torch.device("cpu"))
    assert reason == (
        "amp_dtype=fp16 needs a CUDA device (this run is on cpu); "
        "use amp_dtype=bf16 or amp_dtype=fp32"
    )


def test_bf16_autocast_computes_in_bf16_on_cpu():
    layer = torch.nn.Linear(4, 4)
    with BF16.autocast(torch.device("cpu")):
        out = layer(torch.rand(2, 4))
    assert out.dtype == torch.bfloat16
    assert layer.weight.dtype == torch.float32  # master weights stay fp32


def test_fp32_has_no_autocast_and_no_scaler():
    with FP32.autocast(torch.device("cpu")):
        assert not torch.is_autocast_enabled("cpu")
    assert FP32.grad_scaler(torch.device("cpu")) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: fp16 loss scaling")
def test_fp16_scales_the_loss_on_cuda():
    scaler = FP16.grad_scaler(torch.device("cuda"))
    assert isinstance(scaler, LossScaler) and scaler.is_enabled()


@pytest.mark.parametrize("overflow", [False, True], ids=["finite", "overflow"])
def test_loss_scaler_device_handles_do_what_grad_scaler_does(overflow):
    """What a recorded step does in place of ``unscale_``, ``step`` and ``update``: the same
    unscaled gradients, overflow flag and next scale, with no host read."""
    grad = torch.tensor([16.0, 32.0, float("inf") if overflow else 48.0])
    eager = LossScaler("cpu", init_scale=16.0, growth_interval=1)
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    eager.scale(torch.ones(()))
    weight.grad = grad.clone()
    eager.unscale_(optimizer)
    eager.step(optimizer)
    eager.update()

    device = LossScaler("cpu", init_scale=16.0, growth_interval=1)
    grads, found_inf = [grad.clone()], torch.ones(())
    device.unscale_grads_(grads, found_inf)
    assert found_inf.item() == float(overflow)  # zeroed first, then set by the check
    device.update_from_(found_inf)
    torch.testing.assert_close(grads[0], weight.grad)
    assert device.get_scale() == eager.get_scale() == (8.0 if overflow else 32.0)
    scale, tracker = device.device_state(torch.device("cpu"))
    assert scale.item() == device.get_scale() and tracker.item() == 0
