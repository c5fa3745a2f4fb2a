"""The eager step: the reference :class:`falconet.contract.TrainStep`, op by op.

Each part of the step (:class:`falconet.contract.StepParts`) runs in its phase
(:mod:`falconet.training.phases`). The built-in ``eager`` backend returns it as it is; a backend
that dispatches only the network (``compile``, ``cuda-graph``) gives it its network callable,
and one that replays the whole step (``whole-step``) keeps one for the batches it has not
recorded. It imports torch: a backend imports it when it builds a step, never when the plugin
is listed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from falconet.contract.step import NO_CAPTURES, CaptureStats, StepOutput

if TYPE_CHECKING:
    from falconet.contract.step import StepParts
    from falconet.data.targets import Targets

_NO_SYNC_NEEDED = contextlib.nullcontext()


class BackendNetwork(nn.Module):
    """``model`` called through a backend's ``network`` callable (a graphed network), as a
    module: DDP wraps it and sees exactly the model's parameters, and its reducer's hooks,
    which fire when autograd accumulates a parameter's gradient, fire for the callable's
    backward as for the model's own."""

    def __init__(self, model: nn.Module, network: Callable[[torch.Tensor], Any]) -> None:
        super().__init__()
        self.model = model
        self.network = network

    def forward(self, images: torch.Tensor) -> Any:
        return self.network(images)


class EagerStep:
    """The step op by op, each part in its phase (:mod:`falconet.training.phases`).

    :param network: what is called in place of ``parts.model`` (a compiled or graphed network
        from a backend); the model itself by default. In a distributed run it is called
        through ``parts.replicate``'s DDP wrapper: a network that is not a module is wrapped
        with the model's parameters (:class:`BackendNetwork`), so DDP's gradient hooks fire
        when its backward hands the parameters their gradients.
    :param stats: the capture statistics of that network (none by default).
    """

    def __init__(
        self,
        parts: StepParts,
        network: Callable[[torch.Tensor], Any] | None = None,
        stats: Callable[[], CaptureStats] | None = None,
    ) -> None:
        self.parts = parts
        if network is None:
            network = parts.model
        if parts.replicate is not None:
            module = (
                network if isinstance(network, nn.Module) else BackendNetwork(parts.model, network)
            )
            network = parts.replicate(module)
        self.network = network
        self._stats = stats
        # DDP all-reduces in every backward unless told not to: a batch that does not update
        # only accumulates, and the update's backward reduces the sum once
        self._replicated = isinstance(self.network, DistributedDataParallel)
        self._buffers = list(parts.model.buffers())

    def stats(self) -> CaptureStats:
        return self._stats() if self._stats is not None else NO_CAPTURES

    def __call__(self, images: torch.Tensor, targets: Targets, *, update: bool) -> StepOutput:
        p = self.parts
        local = self.network.no_sync() if self._replicated and not update else _NO_SYNC_NEEDED
        with local:
            with p.phases("forward"), p.precision.autocast(p.device):
                outputs = self.network(images)
            with p.phases("loss"):
                loss, parts = p.loss(outputs, targets)
            with p.phases("backward"):
                scaled = loss * p.loss_gain
                (p.scaler.scale(scaled) if p.scaler else scaled).backward()
        if update:
            self.update()
        return StepOutput(loss, parts)

    def update(self) -> None:
        """Schedule, unscale, clip, step, zero the gradients; then the EMA."""
        p = self.parts
        with p.phases("optimizer"):
            p.set_rates()
            if p.scaler:
                p.scaler.unscale_(p.optimizer)
            if p.clip_grad > 0:
                torch.nn.utils.clip_grad_norm_(p.model.parameters(), p.clip_grad, foreach=True)
            if p.scaler:
                p.scaler.step(p.optimizer)
                p.scaler.update()
            else:
                p.optimizer.step()
            p.optimizer.zero_grad(set_to_none=True)
            p.progress.updates += 1
            if p.collectives is not None and self._buffers:
                # DDP's own buffer broadcast is off (replicate): here, after the update and
                # before the EMA reads them, every rank takes rank 0's statistics
                p.collectives.broadcast_(self._buffers)
        with p.phases("ema"):
            if p.ema is not None:
                p.ema.update(p.model)
