"""Parameter groups, the lr/momentum schedule and the EMA."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from falconet.training.config import TrainConfig, build_config
from falconet.training.optimization import ModelEMA, Schedule, build_optimizer, parameter_groups


def _net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1, bias=True))


def test_groups_keep_decay_off_norms_and_biases():
    net = _net()
    weights, norms, biases = parameter_groups(net, 0.1, decay_all=False)
    assert weights["params"] == [net[0].weight, net[2].weight] and weights["weight_decay"] == 0.1
    assert norms["params"] == [net[1].weight] and norms["weight_decay"] == 0.0
    assert biases["params"] == [net[0].bias, net[1].bias, net[2].bias]
    assert biases["weight_decay"] == 0.0
    assert parameter_groups(net, 0.1, decay_all=True)[2]["weight_decay"] == 0.1


class _WithBackbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = _net()
        self.head = nn.Linear(2, 3)


def test_a_backbone_trains_at_its_share_of_the_rate():
    net = _WithBackbone()
    cfg = build_config(
        TrainConfig,
        {
            "optimizer": "adamw",
            "lr0": 1e-3,
            "lrf": 1.0,
            "warmup_epochs": 0,
            "backbone_lr_scale": 0.1,
        },
    )
    optimizer = build_optimizer(net, cfg, accumulate=1)
    Schedule(cfg, steps_per_epoch=10).apply(optimizer, step=5, epoch=0)
    rates = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            rates[id(param)] = group["lr"]
    assert [rates[id(p)] for p in net.backbone.parameters()] == pytest.approx([1e-4] * 6)
    assert [rates[id(p)] for p in net.head.parameters()] == pytest.approx([1e-3] * 2)
    assert len(rates) == len(list(net.parameters()))  # every parameter in one group
    # at the default scale the groups are the three of a model without a backbone
    assert len(build_optimizer(net, build_config(TrainConfig, {}), 1).param_groups) == 3


def test_weight_decay_scales_with_the_nominal_batch():
    cfg = build_config(TrainConfig, {"batch": 8, "nbs": 64, "weight_decay": 5e-4})
    optimizer = build_optimizer(_net(), cfg, accumulate=8)
    assert optimizer.param_groups[0]["weight_decay"] == pytest.approx(5e-4)
    optimizer = build_optimizer(_net(), cfg, accumulate=4)  # 32 images per step, not 64
    assert optimizer.param_groups[0]["weight_decay"] == pytest.approx(2.5e-4)


def test_schedule_warms_up_then_decays():
    cfg = build_config(
        TrainConfig,
        {
            "epochs": 10,
            "lr0": 0.01,
            "lrf": 0.1,
            "warmup_epochs": 1,
            "warmup_bias_lr": 0.1,
            "momentum": 0.9,
            "warmup_momentum": 0.8,
        },
    )
    optimizer = build_optimizer(_net(), cfg, accumulate=1)
    schedule = Schedule(cfg, steps_per_epoch=20)
    assert schedule.warmup_steps == 100  # at least 100 optimizer steps
    schedule.apply(optimizer, step=0, epoch=0)
    lrs = {g["kind"]: g["lr"] for g in optimizer.param_groups}
    assert lrs == {"weight": 0.0, "norm": 0.0, "bias": 0.1}
    assert optimizer.param_groups[0]["momentum"] == pytest.approx(0.8)
    schedule.apply(optimizer, step=50, epoch=2)
    target = 0.01 * ((1 - 2 / 10) * 0.9 + 0.1)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(target / 2)
    assert optimizer.param_groups[2]["lr"] == pytest.approx(0.1 + (target - 0.1) / 2)
    schedule.apply(optimizer, step=500, epoch=9)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.01 * 0.19] * 3)
    assert optimizer.param_groups[0]["momentum"] == pytest.approx(0.9)
    cosine = Schedule(
        build_config(TrainConfig, {"epochs": 10, "lrf": 0.1, "schedule": "cosine"}), 20
    )
    assert cosine.decay(0) == pytest.approx(1.0) and cosine.decay(10) == pytest.approx(0.1)
    assert cosine.decay(5) == pytest.approx(0.55)


def test_ema_follows_weights_with_a_ramped_decay_and_copies_integer_buffers():
    net = _net()
    ema = ModelEMA(net, decay=0.9, tau=2.0)
    start = ema.module[0].weight.clone()
    with torch.no_grad():
        net[0].weight.add_(1.0)
    net[1].num_batches_tracked += 5
    ema.update(net)
    d = 0.9 * (1 - math.exp(-1 / 2.0))
    torch.testing.assert_close(ema.module[0].weight, d * start + (1 - d) * net[0].weight)
    assert int(ema.module[1].num_batches_tracked) == 5
    assert not any(p.requires_grad for p in ema.module.parameters())


def test_adamw_bias_warm_up_starts_no_higher_than_lr0():
    cfg = build_config(
        TrainConfig, {"optimizer": "adamw", "lr0": 0.002, "warmup_bias_lr": 0.1, "epochs": 10}
    )
    optimizer = build_optimizer(_net(), cfg, accumulate=1)
    Schedule(cfg, steps_per_epoch=20).apply(optimizer, step=0, epoch=0)
    assert optimizer.param_groups[2]["lr"] == pytest.approx(0.002)
    assert optimizer.param_groups[0]["betas"][0] == pytest.approx(0.8)


def test_ema_update_from_its_tensors_and_weight_matches_update():
    """What a recorded step does in place of :meth:`ModelEMA.update`: lerp the paired tensors
    by ``weight(updates + 1)``, copy the integer ones, then ``advance``."""
    net = _net()
    by_update, by_hand = ModelEMA(net, decay=0.9, tau=2.0), ModelEMA(net, decay=0.9, tau=2.0)
    with torch.no_grad():
        net[0].weight.add_(1.0)
    net[1].num_batches_tracked += 3
    by_update.update(net)
    floats, others = by_hand.tensors(net)
    assert by_hand.tensors(net) is by_hand.tensors(net)  # paired once per model
    assert by_hand.weight(1) == pytest.approx(1 - 0.9 * (1 - math.exp(-1 / 2.0)))
    with torch.no_grad():
        torch._foreach_lerp_(*floats, by_hand.weight(by_hand.updates + 1))
        torch._foreach_copy_(*others)
    by_hand.advance()
    assert by_hand.updates == by_update.updates == 1
    for mine, theirs in zip(
        by_hand.module.state_dict().values(), by_update.module.state_dict().values(), strict=True
    ):
        assert torch.equal(mine, theirs)
