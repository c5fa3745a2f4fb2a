"""``grad_checkpoint``: its values, the refusal for a family without the region, and the block
runner: the same numbers as a plain call (dropout's draws, BatchNorm's running statistics
updated once), eager and under torch.compile."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from falconet.grad_checkpoint import checkpoint, refuse_unsupported, regions
from falconet.plugins import Plugins
from falconet.training.config import ConfigError, build_config, config_model


@pytest.fixture(scope="module")
def keys_model():
    return config_model(Plugins(env={}).load_builtins())


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        (None, "off"),
        (False, "off"),
        ("false", "off"),
        (True, "backbone+neck"),
        ("true", "backbone+neck"),
        ("backbone", "backbone"),
        ("Backbone+Neck", "backbone+neck"),
    ],
)
def test_values(keys_model, given, stored):
    keys = {} if given is None else {"grad_checkpoint": given}
    config = build_config(keys_model, keys)
    assert config.grad_checkpoint == stored
    assert regions(config.model_dump()) == (
        frozenset() if stored == "off" else frozenset(stored.split("+"))
    )


@pytest.mark.parametrize("bad", ["neck", "all", "3"])
def test_bad_values_are_refused_with_the_choices(keys_model, bad):
    with pytest.raises(ConfigError, match=r"grad_checkpoint=.*not one of false \(off\), backbone"):
        build_config(keys_model, {"grad_checkpoint": bad})


class _Family:
    name = "toy"


def test_a_family_without_the_region_refuses_the_key():
    refuse_unsupported(_Family(), {"grad_checkpoint": "off"})
    with pytest.raises(
        ConfigError, match="grad_checkpoint=backbone: the toy family checkpoints none"
    ):
        refuse_unsupported(_Family(), {"grad_checkpoint": "backbone"})
    backbone_only = _Family()
    backbone_only.grad_checkpoint_regions = ("backbone",)
    refuse_unsupported(backbone_only, {"grad_checkpoint": "backbone"})
    with pytest.raises(ConfigError, match="checkpoints backbone only"):
        refuse_unsupported(backbone_only, {"grad_checkpoint": "backbone+neck"})


class _Block(nn.Sequential):
    def __init__(self) -> None:
        super().__init__(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU(), nn.Dropout(0.3)
        )


def _run(recompute: bool, compiled: bool = False, steps: int = 2):
    torch.manual_seed(0)
    block = _Block().train()
    x = torch.rand(2, 3, 8, 8)

    def forward(inputs):
        return checkpoint(block, inputs) if recompute else block(inputs)

    call = torch.compile(forward) if compiled else forward
    for _ in range(steps):
        torch.manual_seed(1)
        block.zero_grad()
        out = call(x)
        out.square().mean().backward()
    return out.detach(), [p.grad for p in block.parameters()], block.state_dict()


def test_the_recomputation_gives_the_same_numbers_and_updates_batch_norm_once():
    """Exactly equal: the recomputation runs the same kernels on the same inputs, with the
    random state put back (dropout's mask) and the running statistics put back after it."""
    out0, grads0, state0 = _run(recompute=False)
    out1, grads1, state1 = _run(recompute=True)
    assert torch.equal(out0, out1)
    assert all(torch.equal(a, b) for a, b in zip(grads0, grads1, strict=True))
    assert all(torch.equal(state0[k], state1[k]) for k in state0)
    assert state1["1.num_batches_tracked"] == 2


def _kept(call) -> int:
    """How many tensors autograd keeps outside checkpointed blocks during ``call()``."""
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        call()
    return len(kept)


def test_in_training_a_block_keeps_its_input_only_and_elsewhere_is_a_plain_call():
    block = _Block()
    x = torch.rand(1, 3, 8, 8, requires_grad=True)
    assert _kept(lambda: checkpoint(block, x)) == 1 < _kept(lambda: block(x))  # x alone
    block.eval()
    assert _kept(lambda: checkpoint(block, x)) == _kept(lambda: block(x)) > 0


@pytest.mark.skipif(
    not any(map(shutil.which, ("c++", "g++", "clang++"))), reason="Inductor needs a C++ compiler"
)
def test_under_compile_batch_norm_is_updated_once():
    """Inductor rounds differently from eager, so a tolerance; a second update would move
    the running mean by about momentum x batch mean, far above it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch._dynamo.reset()
        *_, eager = _run(recompute=False, steps=1)
        *_, compiled = _run(recompute=True, compiled=True, steps=1)
    finally:
        torch.set_num_threads(threads)
    assert compiled["1.num_batches_tracked"] == 1
    for key in ("1.running_mean", "1.running_var"):
        assert torch.allclose(compiled[key], eager[key], atol=1e-6), key
