"""The fp8 backend's errors, keys and evaluation path (CPU), and a conversion on the GPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from falconet.contract import PrecisionContext
from falconet.plugins import get_plugins
from falconet.precision import BF16
from falconet.training.config import ConfigError, config_model
from falconet.training.planning import plan_run
from falconet_precision_te_fp8.backend import Fp8Precision, recipe_error, te_version
from falconet_testing.contracts import PrecisionBackendContract


class TestFp8Contract(PrecisionBackendContract):
    backend = Fp8Precision()


def test_off_cuda_the_reason_names_the_key_and_the_device():
    reason = Fp8Precision().unavailable_reason(torch.device("cpu"))
    assert reason == "amp_dtype=fp8 needs a CUDA GPU (this run is on cpu)"


@pytest.mark.skipif(te_version() is not None, reason="Transformer Engine is installed here")
def test_without_transformer_engine_the_reason_is_the_install_command():
    reason = Fp8Precision().unavailable_reason(torch.device("cuda"))
    assert "needs Transformer Engine" in reason and "pip install" in reason


def test_a_blackwell_recipe_on_hopper_says_which_recipes_apply():
    message = recipe_error("mxfp8", (9, 0), "NVIDIA H200")
    assert "fp8_recipe=mxfp8 needs a Blackwell GPU" in message
    assert "NVIDIA H200 is 9.0" in message and "current, delayed or block" in message
    assert recipe_error("block", (9, 0), "NVIDIA H200") is None
    assert recipe_error("nvfp4", (10, 0), "NVIDIA B200") is None


def test_the_keys_are_the_plugins_and_validated_by_the_core():
    fields = config_model(get_plugins()).model_fields
    assert {"fp8_recipe", "fp8_layers", "fp8_min_dim"} <= set(fields)
    with pytest.raises(ConfigError, match="fp8_recipe"):
        plan_run({"data": "shapes", "fp8_recipe": "e5m2"}, get_plugins())


def test_the_core_refuses_an_fp8_run_on_the_cpu_with_the_reason():
    from falconet.training.backends import choose_precision

    context = PrecisionContext(torch.device("cpu"), {"amp_dtype": "fp8"})
    with pytest.raises(ConfigError, match="amp_dtype=fp8 needs a CUDA GPU"):
        choose_precision("fp8", context, get_plugins())


def test_a_trained_model_evaluates_in_bf16():
    context = PrecisionContext(torch.device("cuda"), training=False)
    assert Fp8Precision().configure(context) is BF16


needs_te_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or Fp8Precision().unavailable_reason(torch.device("cuda")),
    reason="needs Transformer Engine and a CUDA GPU of compute capability 8.9+",
)


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 64))


@pytest.mark.gpu
@needs_te_gpu
def test_converted_layers_keep_the_plain_state_dict_and_train():
    device = torch.device("cuda")
    torch.manual_seed(0)
    plain = mlp()
    expected = {k: v.clone() for k, v in plain.state_dict().items()}
    context = PrecisionContext(device, {"fp8_layers": "all"}, batch=32, imgsz=32)
    run = Fp8Precision().configure(context)
    model = run.wrap_model(plain).to(device)
    assert run.converted == ["1", "3"]
    assert model.state_dict().keys() == expected.keys()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with run.autocast(device):
        loss = model(torch.rand(32, 3, 32, 32, device=device)).float().pow(2).mean()
    loss.backward()
    optimizer.step()
    assert not torch.equal(model.state_dict()["1.weight"].cpu(), expected["1.weight"])
    mlp().load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})


@pytest.mark.gpu
@needs_te_gpu
def test_a_converted_layers_output_may_be_modified_in_place():
    """As a family's residual ``x = linear(x); x += skip`` does on ``[B, L, C]`` tokens
    (detr-n with every layer converted failed autograd's view check before)."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    plain = nn.Linear(64, 64).to(device)
    tokens = torch.randn(4, 96, 64, device=device)
    context = PrecisionContext(device, {"fp8_layers": "all"}, batch=4, imgsz=32)
    run = Fp8Precision().configure(context)
    layer = run.te.Fp8Linear.replacing(plain)
    with run.te.autocast(run.recipe):
        out = layer(tokens)
    assert out.shape == (4, 96, 64)
    out += tokens  # in place on the layer's output
    out.float().pow(2).mean().backward()
    assert plain.weight.grad is not None and torch.isfinite(plain.weight.grad).all()


@pytest.mark.gpu
@needs_te_gpu
def test_with_no_layer_converted_the_step_is_the_bf16_step():
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = mlp().to(device)
    context = PrecisionContext(device, {"fp8_min_dim": 4096}, batch=8, imgsz=32)  # none eligible
    run = Fp8Precision().configure(context)
    run.wrap_model(model)
    assert run.converted == []
    images = torch.rand(8, 3, 32, 32, device=device)
    with run.autocast(device):
        fp8_run = model(images)
    with BF16.autocast(device):
        bf16 = model(images)
    assert torch.equal(fp8_run, bf16)


@pytest.mark.gpu
@needs_te_gpu
def test_a_product_is_timed_as_replays_of_its_recorded_pass():
    """Both passes, Transformer Engine's included, record in a CUDA graph, so the gating of a
    capturing run times their kernels alone; launched, the same passes take at least as long."""
    from falconet_precision_te_fp8 import te_modules
    from falconet_precision_te_fp8.gating import Product

    recipe = te_modules.build_recipe("current")
    product = Product(16 * 1024, 256, 1024)
    replayed = te_modules.time_product(product, recipe, replayed=True)
    launched = te_modules.time_product(product, recipe, replayed=False)
    assert replayed.replayed and not launched.replayed
    assert replayed.bf16_ms > 0 and replayed.fp8_ms > 0
    assert replayed.fp8_ms <= launched.fp8_ms * 1.1
