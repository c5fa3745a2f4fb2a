"""The optimizer, its learning-rate and momentum schedule, and the EMA of the weights.

The schedule is a pure function of the optimizer-step count and the epoch, so resuming only
needs those two numbers. Parameters fall in three groups, as the YOLO recipes train them:
weights of convolutions and linear layers (with weight decay), normalisation weights and biases
(without, unless ``decay_norm_and_bias``); biases warm up from ``warmup_bias_lr`` down, the rest
from 0 up. A model with a ``backbone`` submodule has its parameters in groups of their own when
``backbone_lr_scale`` is below 1 (the DETR recipes train a backbone at a tenth of the rate):
every group's rate is the schedule's times its ``lr_scale``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from falconet.training.config import TrainConfig

_NORMS = (
    nn.modules.batchnorm._BatchNorm,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.modules.instancenorm._InstanceNorm,
)


def parameter_groups(
    model: nn.Module, weight_decay: float, decay_all: bool, backbone_lr_scale: float = 1.0
) -> list[dict]:
    """``[weights, norm weights, biases]`` as optimizer groups, each tagged with ``kind`` and
    ``lr_scale``; the ``backbone``'s three again at ``backbone_lr_scale`` when it is below 1."""
    backbone = getattr(model, "backbone", None)
    split = backbone_lr_scale < 1 and isinstance(backbone, nn.Module)
    owned = {id(p) for p in backbone.parameters()} if split else set()
    no_decay = weight_decay if decay_all else 0.0
    groups = []
    for scale, in_backbone in (
        ((1.0, False), (backbone_lr_scale, True)) if split else ((1.0, False),)
    ):
        weights, norms, biases = [], [], []
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                if not param.requires_grad or (id(param) in owned) != in_backbone:
                    continue
                if name == "bias":
                    biases.append(param)
                elif isinstance(module, _NORMS):
                    norms.append(param)
                else:
                    weights.append(param)
        groups += [
            {"params": weights, "weight_decay": weight_decay, "kind": "weight", "lr_scale": scale},
            {"params": norms, "weight_decay": no_decay, "kind": "norm", "lr_scale": scale},
            {"params": biases, "weight_decay": no_decay, "kind": "bias", "lr_scale": scale},
        ]
    return groups


def build_optimizer(model: nn.Module, cfg: TrainConfig, accumulate: int) -> torch.optim.Optimizer:
    """SGD or AdamW over :func:`parameter_groups`; weight decay scales with the batch as the
    nominal-batch recipes do (``batch * accumulate / nbs``)."""
    decay = cfg.weight_decay * cfg.batch * accumulate / cfg.nbs
    groups = parameter_groups(model, decay, cfg.decay_norm_and_bias, cfg.backbone_lr_scale)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr0, momentum=cfg.momentum, nesterov=cfg.nesterov)
    return torch.optim.AdamW(groups, lr=cfg.lr0, betas=(cfg.momentum, 0.999))


class Schedule:
    """Learning rate and momentum for an optimizer step.

    Warm-up is linear over ``warmup_steps`` optimizer steps (at least 100, unless warm-up is
    off); afterwards the rate follows ``lr0 * decay(epoch)``, ``decay`` going from 1 to ``lrf``
    over the run, linearly or along a cosine.
    """

    def __init__(self, cfg: TrainConfig, steps_per_epoch: int) -> None:
        self.cfg = cfg
        warm = cfg.warmup_epochs * steps_per_epoch
        self.warmup_steps = max(round(warm), 100) if cfg.warmup_epochs > 0 else 0

    def decay(self, epoch: int) -> float:
        progress = epoch / self.cfg.epochs
        if self.cfg.schedule == "cosine":
            return ((1 - math.cos(progress * math.pi)) / 2) * (self.cfg.lrf - 1) + 1
        return (1 - progress) * (1.0 - self.cfg.lrf) + self.cfg.lrf

    def apply(self, optimizer: torch.optim.Optimizer, step: int, epoch: int) -> None:
        """Set every group's lr (and momentum) for optimizer step ``step`` in ``epoch``."""
        cfg, target = self.cfg, self.cfg.lr0 * self.decay(epoch)
        warming = step < self.warmup_steps
        t = step / self.warmup_steps if warming else 1.0
        # Adam's step is about lr whatever the gradient, so a bias warm-up from 0.1 (right for
        # SGD) would move every bias by 0.1 a step; under AdamW it starts at most at lr0
        bias_start = (
            cfg.warmup_bias_lr if cfg.optimizer == "sgd" else min(cfg.warmup_bias_lr, target)
        )
        for group in optimizer.param_groups:
            scaled = target * group.get("lr_scale", 1.0)
            if warming:
                start = bias_start if group["kind"] == "bias" else 0.0
                group["lr"] = start + (scaled - start) * t
            else:
                group["lr"] = scaled
            momentum = cfg.warmup_momentum + (cfg.momentum - cfg.warmup_momentum) * t
            if "momentum" in group:
                group["momentum"] = momentum
            else:
                group["betas"] = (momentum, group["betas"][1])


class EMATensors(NamedTuple):
    """The tensors an EMA update reads and writes, paired with the model's.

    ``floats``: ``(ema's, model's)`` floating-point state, lerped towards the model's;
    ``others``: ``(ema's, model's)`` integer state (BatchNorm's batch counters), copied."""

    floats: tuple[list[torch.Tensor], list[torch.Tensor]]
    others: tuple[list[torch.Tensor], list[torch.Tensor]]


class ModelEMA:
    """Exponential moving average of a model's floating-point state (weights and BN statistics).

    The decay ramps up as ``decay * (1 - exp(-updates / tau))`` so early, poor weights fade fast.
    Updates run on the device with foreach kernels; nothing is read back to the host. A graph
    backend that records the update does :meth:`update`'s work itself from :meth:`tensors` and
    :meth:`weight`, then counts it with :meth:`advance`.
    """

    def __init__(self, model: nn.Module, decay: float, tau: float, updates: int = 0) -> None:
        import copy

        self.module = copy.deepcopy(model).eval()
        for param in self.module.parameters():
            param.requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, updates
        self._source: nn.Module | None = None
        self._tensors = EMATensors(([], []), ([], []))

    def tensors(self, model: nn.Module) -> EMATensors:
        """Our state tensors paired with ``model``'s (paired once: state_dict walks cost host
        time)."""
        if self._source is not model:
            mine = self.module.state_dict(keep_vars=True)
            theirs = model.state_dict(keep_vars=True)
            floats = [k for k in mine if mine[k].dtype.is_floating_point]
            others = [k for k in mine if not mine[k].dtype.is_floating_point]
            self._tensors = EMATensors(
                ([mine[k].data for k in floats], [theirs[k].data for k in floats]),
                ([mine[k].data for k in others], [theirs[k].data for k in others]),
            )
            self._source = model
        return self._tensors

    def weight(self, update: int) -> float:
        """The lerp weight of update number ``update`` (1-based): ``1 - decay x ramp``."""
        return 1.0 - self.decay * (1 - math.exp(-update / self.tau))

    def advance(self) -> None:
        """Count an update done outside :meth:`update` (a recorded one)."""
        self.updates += 1

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        floats, others = self.tensors(model)
        self.advance()
        torch._foreach_lerp_(*floats, self.weight(self.updates))
        if others[0]:
            torch._foreach_copy_(*others)
