"""Choosing the run's precision backend and graph backend from the registries.

Each choice reads the registries, so a plugin's backend is chosen exactly as a built-in one. A
graph backend that cannot apply here declines with one log line and the run goes on with the
next (``graph=auto``) or with ``eager`` (a backend asked for by name): falling back changes
the speed, not the numbers. A precision backend asked for by name that cannot run here is an
error (falling back would silently change the numbers), while ``amp_dtype=auto`` picks what
the device supports.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from falconet.contract import GraphBackend, GraphContext, PrecisionBackend, PrecisionContext
from falconet.plugins import Plugins
from falconet.training.config import ConfigError

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger("falconet.train")


def choose_precision(name: str, context: PrecisionContext, plugins: Plugins) -> PrecisionBackend:
    """The precision backend for ``amp_dtype=name``, configured for ``context``'s run
    (``auto``: bf16 on a GPU that has it, else fp16 on a GPU, else fp32 on the CPU, where
    autocast is slower than fp32)."""
    device = context.device
    if name == "auto":
        if device.type == "cuda":
            name = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:
            name = "fp32"
    backend = plugins.precision_backends.get(name)
    if reason := backend.unavailable_reason(device):
        raise ConfigError(reason)
    return backend.configure(context)


def auto_order(plugins: Plugins) -> list[str]:
    """The graph backends ``graph=auto`` tries, highest ``priority`` first (ties by name);
    backends without a priority are left out."""
    ranked = [e for e in plugins.graph_backends.entries() if e.item.priority is not None]
    return [e.name for e in sorted(ranked, key=lambda e: (-e.item.priority, e.name))]


def step_replays(name: str, plugins: Plugins) -> bool:
    """Whether the step of ``graph=name`` will replay recordings, as its backend declares;
    ``auto``: the first backend :func:`auto_order` tries (where it declines the run launches
    its kernels after all; the backend chosen then is known only once the precision is)."""
    if name == "auto":
        order = auto_order(plugins)
        name = order[0] if order else "eager"
    return plugins.graph_backends.get(name).replays


def choose_graph(
    name: str, context: GraphContext, model: nn.Module, plugins: Plugins
) -> tuple[str, GraphBackend]:
    """``(name actually used, backend)``: ``graph=auto`` takes the first of
    :func:`auto_order` that does not decline; a backend asked for by name that declines falls
    back to ``eager``. The log says which was taken and why the others were not."""
    if name == "auto":
        declined = []
        for candidate in auto_order(plugins):
            if reason := decline_reason(candidate, context, model, plugins):
                declined.append(f"{candidate}: {reason}")
                continue
            log.info("graph=auto: %s%s", candidate, "".join(f"; {d}" for d in declined))
            return candidate, plugins.graph_backends.get(candidate)
        raise ConfigError(
            "graph=auto: every installed graph backend declined ("
            + "; ".join(declined)
            + "); the built-in eager backend never does, so falconet-core is broken"
        )
    if reason := decline_reason(name, context, model, plugins):
        if name != "eager":
            log.warning("graph=%s declined: %s; the run continues with graph=eager", name, reason)
        return "eager", plugins.graph_backends.get("eager")
    return name, plugins.graph_backends.get(name)


def decline_reason(
    name: str, context: GraphContext, model: nn.Module, plugins: Plugins
) -> str | None:
    """Why the backend ``name`` will not run this model's step, or ``None``.

    A family's capture region smaller than the whole model needs the backend's wrapper
    installed in place inside the model, which no backend does yet."""
    reason = plugins.graph_backends.get(name).decline_reason(context)
    if reason is None and name != "eager" and context.capture_region not in (None, model):
        reason = "a capture region smaller than the whole model is not supported yet"
    return reason
