"""The training step as two functions of static tensors, so that each can be one CUDA graph.

``micro(images, targets)`` is a batch's forward, loss and backward: the gradient of
``loss x batch`` (the trainer's scaling) is added to static gradient buffers, which are the
parameters' ``.grad`` while the whole step is in use. ``update()`` is the optimizer step:
clipping, SGD with momentum (Nesterov or not, per-group weight decay), the EMA update and
zeroing the gradients. Everything a step changes on the host side lives in device tensors
that are filled before each call: each group's learning rate and momentum (the warm-up ramps
both) and the EMA's weight. The optimizer's momentum buffers are the trainer's own
(``optimizer.state[p]["momentum_buffer"]``), so checkpoints and resume are unchanged.

The SGD arithmetic is the same as ``torch.optim.SGD``'s, with the learning rate and momentum
multiplied in as tensors rather than fused in as scalars (a fused multiply-add may round once
where this rounds twice), so it agrees with the eager optimizer to rounding, not bit for bit;
a replay agrees with this module run eagerly bit for bit.

Run eagerly on the CPU, these functions are what the CPU tests compare with the trainer's own
step; :mod:`falconet_graphs_cuda.whole_step` records them as CUDA graphs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.func import functional_call

if TYPE_CHECKING:
    from falconet.training.trainer import Trainer


@dataclass
class Group:
    """One optimizer parameter group: indices into the step's parameters, its constants and
    the device tensors of its learning rate and momentum."""

    indices: list[int]
    weight_decay: float
    nesterov: bool
    lr: torch.Tensor
    momentum: torch.Tensor


class StaticStep:
    """Forward + loss + backward and the optimizer step of ``trainer``, on static tensors."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.network = trainer.model
        named = [(n, p) for n, p in self.network.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.grads = [torch.zeros_like(p) for p in self.params]
        # the scalars in the parameters' dtype, as torch.optim's Python floats become
        scalar = {"device": trainer.device, "dtype": self.params[0].dtype}
        index = {id(p): i for i, p in enumerate(self.params)}
        self.groups = [
            Group(
                [index[id(p)] for p in group["params"]],
                float(group["weight_decay"]),
                bool(group.get("nesterov", False)),
                torch.zeros((), **scalar),
                torch.zeros((), **scalar),
            )
            for group in trainer.optimizer.param_groups
            if group["params"]
        ]
        self.ema_weight = torch.zeros((), **scalar)
        self.bound = False

    # ------------------------------------------------------------------------ host to device
    def ready(self) -> bool:
        """Whether the optimizer has its momentum buffers (made by its first eager step)."""
        state = self.trainer.optimizer.state
        return all(state.get(p, {}).get("momentum_buffer") is not None for p in self.params)

    def bind(self) -> None:
        """Make the static buffers the parameters' ``.grad``, keeping any gradient already
        accumulated; a ``None`` gradient (the trainer's eager optimizer step set it so)
        becomes zeros."""
        for param, static in zip(self.params, self.grads, strict=True):
            grad = param.grad
            if grad is static:
                continue
            if grad is None:
                static.zero_()
            else:
                static.copy_(grad)
            param.grad = static
        self.bound = True

    def fill_scalars(self, *, update: bool) -> None:
        """Copy this step's learning rates and momenta (the trainer's schedule has just set
        them on its optimizer) and the EMA weight into their device tensors."""
        if not update:
            return
        for group, source in zip(self.groups, self._nonempty_groups(), strict=True):
            group.lr.fill_(source["lr"])
            group.momentum.fill_(source["momentum"])
        ema = self.trainer.ema
        if ema is not None:
            decay = ema.decay * (1 - math.exp(-(ema.updates + 1) / ema.tau))
            self.ema_weight.fill_(1.0 - decay)

    def _nonempty_groups(self) -> list[dict[str, Any]]:
        return [g for g in self.trainer.optimizer.param_groups if g["params"]]

    # ------------------------------------------------------------------------ the functions
    def micro(
        self, images: torch.Tensor, targets: dict[str, torch.Tensor], *, accumulate: bool = True
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Forward, loss and backward of one batch; adds ``d(loss x batch)/dparams`` to the
        static gradients unless ``accumulate`` is false (a warm-up pass)."""
        trainer = self.trainer
        pairs = zip(self.names, self.params, strict=True)
        leaves = {n: p.detach().requires_grad_() for n, p in pairs}
        with trainer.precision.autocast(trainer.device):
            outputs = functional_call(self.network, leaves, (images,))
        loss, parts = trainer.loss_fn(outputs, targets)
        grads = torch.autograd.grad(
            loss * trainer.cfg.batch, list(leaves.values()), allow_unused=True
        )
        if accumulate:
            used = [(s, g) for s, g in zip(self.grads, grads, strict=True) if g is not None]
            torch._foreach_add_([s for s, _ in used], [g for _, g in used])
        return loss.detach(), parts

    @torch.no_grad()
    def update(self) -> None:
        """Clip, SGD step, EMA update, zero the gradients: the trainer's optimizer phase."""
        trainer = self.trainer
        if trainer.cfg.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(self.params, trainer.cfg.clip_grad, foreach=True)
        state = trainer.optimizer.state
        for group in self.groups:
            params = [self.params[i] for i in group.indices]
            grads = [self.grads[i] for i in group.indices]
            buffers = [state[p]["momentum_buffer"] for p in params]
            if group.weight_decay:
                grads = torch._foreach_add(grads, params, alpha=group.weight_decay)
            torch._foreach_mul_(buffers, group.momentum)
            torch._foreach_add_(buffers, grads)
            if group.nesterov:
                steps = torch._foreach_add(grads, torch._foreach_mul(buffers, group.momentum))
            else:
                steps = buffers
            torch._foreach_sub_(params, torch._foreach_mul(steps, group.lr))
        floats, others = self.ema_tensors()
        if floats[0]:
            torch._foreach_lerp_(*floats, [self.ema_weight] * len(floats[0]))
        if others[0]:
            torch._foreach_copy_(*others)
        torch._foreach_zero_(self.grads)

    def ema_tensors(self) -> tuple[tuple[list, list], tuple[list, list]]:
        """``(ema floats, model floats), (ema others, model others)``: the pairs the EMA
        update reads (empty without EMA)."""
        ema = self.trainer.ema
        if ema is None:
            return ([], []), ([], [])
        if ema._source is not self.trainer.model:
            ema._bind(self.trainer.model)
        return ema._floats, ema._others

    def after_update(self) -> None:
        """Host-side bookkeeping of an update done by :meth:`update` (eager or replayed)."""
        if self.trainer.ema is not None:
            self.trainer.ema.updates += 1
