"""The built-in precision backends against the precision contract suite."""

from __future__ import annotations

import pytest
import torch

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
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.is_enabled()
