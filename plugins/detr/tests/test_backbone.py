"""The backbone's ConvNorm goes through ``falconet.ops.batch_norm_silu``: run as is it is the
plain convolution, BatchNorm and SiLU bit for bit, and a backend's function mode that replaces
the op (``bn_silu=triton``) sees every activated ConvNorm of the family."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from falconet import ops
from falconet_detr.backbone import Backbone, ConvNorm


def test_conv_norm_is_conv_batch_norm_silu_bit_for_bit():
    torch.manual_seed(0)
    block = ConvNorm(3, 8, 3, 2).train()
    reference = ConvNorm(3, 8, 3, 2).train()
    reference.load_state_dict(block.state_dict())
    assert list(block.state_dict()) == [  # the names saved checkpoints hold
        "0.weight",
        "1.weight",
        "1.bias",
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
    ]
    x = torch.randn(2, 3, 16, 16)
    conv, bn = reference
    expected = F.silu(bn(conv(x)), inplace=True)
    got = block(x)
    assert torch.equal(got, expected)
    got.square().sum().backward()
    expected.square().sum().backward()
    for a, b in zip(block.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    assert torch.equal(block[1].running_var, reference[1].running_var)


def test_a_backend_mode_sees_every_activated_conv_norm():
    class Seen(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is ops.batch_norm_silu:
                Seen.calls += 1
            return func(*args, **(kwargs or {}))

    backbone = Backbone((8, 16, 24, 32), depth=2)
    activated = sum(isinstance(m, ConvNorm) and m.act for m in backbone.modules())
    with Seen():
        backbone(torch.randn(1, 3, 64, 64))
    assert Seen.calls == activated == 8  # the stem's two and each block's first
