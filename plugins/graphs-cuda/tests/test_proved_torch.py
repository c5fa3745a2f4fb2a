"""The whole step's fp16 and bf16 replay runs only on the torch releases it was proved
exact on; elsewhere the backend declines, saying how to force it."""

import pytest
import torch

from falconet.contract import GraphContext
from falconet.precision import BF16, FP16, FP32
from falconet_graphs_cuda.backend import CudaGraphBackend, WholeStepBackend
from falconet_graphs_cuda.keys import GraphsCudaKeys
from falconet_graphs_cuda.proved_torch import PROVED_ON, release, unproved_reason


def test_release_is_major_minor():
    assert release("2.11.0+cu130") == "2.11"
    assert release("2.15.0.dev20261101+cpu") == "2.15"
    assert release("3.0") == "3.0"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_replays_only_where_proved(dtype):
    proved = PROVED_ON[dtype][0]
    assert unproved_reason(dtype, f"{proved}.1+cu130") is None
    reason = unproved_reason(dtype, "9.99.0")
    assert f"torch {proved} only" in reason and "9.99.0" in reason
    assert "replay_unproved=true" in reason


def test_fp32_is_not_gated():
    assert unproved_reason(None, "9.99.0") is None
    assert unproved_reason(torch.float32, "9.99.0") is None


def _context(precision, **keys):
    net = torch.nn.Linear(1, 1)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    cuda = torch.device("cuda", 0)
    return GraphContext(cuda, precision, 1, net, True, sgd, config=GraphsCudaKeys(**keys))


@pytest.mark.parametrize(("precision", "dtype"), [(FP16, torch.float16), (BF16, torch.bfloat16)])
def test_the_backend_declines_an_unproved_torch_unless_forced(precision, dtype, monkeypatch):
    """The dtype is what the run's precision autocasts to on the GPU, asked of the precision
    object; a CPU machine's torch autocasts nothing on CUDA, so that answer is given here, and
    the running torch's version is one the replay was not proved on."""
    monkeypatch.setattr(torch, "__version__", "9.99.0")
    monkeypatch.setattr("falconet.precision.autocast_dtype", lambda p, d: dtype)
    reason = WholeStepBackend().decline_reason(_context(precision))
    assert reason is not None and "9.99.0" in reason and "replay_unproved=true" in reason
    assert WholeStepBackend().decline_reason(_context(precision, replay_unproved=True)) is None
    assert CudaGraphBackend().decline_reason(_context(precision)) is None  # the network's
    monkeypatch.setattr("falconet.precision.autocast_dtype", lambda p, d: None)
    assert WholeStepBackend().decline_reason(_context(FP32)) is None
