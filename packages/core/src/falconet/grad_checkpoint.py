"""Gradient (activation) checkpointing: the ``grad_checkpoint`` key and the block runner.

``grad_checkpoint`` trades compute for activation memory: the blocks it names keep only their
inputs in the forward and run again in the backward (``torch.utils.checkpoint``, non-reentrant)
to remake the activations their gradients need. ``off`` (``false``, the default); ``backbone``:
the backbone's stages; ``backbone+neck`` (``true``): those and the neck's blocks (YOLO's PAN,
DETR's hybrid encoder). A family applies it to its own network: it declares the regions it can
checkpoint (:class:`falconet.contract.CheckpointingFamily`), reads the key when it is
configured for a run and runs each block of those regions through :func:`checkpoint`; a family
that declares none refuses the key when the run is planned (:func:`refuse_unsupported`).

The recomputation gives the forward's numbers again: the random generators' states are put back
for it (``preserve_rng_state``: dropout draws the same masks), and BatchNorm's running
statistics, which a forward in training mode updates, are put back after it, so each step
updates them once, as without checkpointing. docs/models.md says where it applies;
``tools/bench_grad_checkpoint.py`` measures it on a GPU.

Importing this module imports pydantic only; torch is imported when a block runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

from falconet.keys import KeyGroup

if TYPE_CHECKING:
    import torch

CHOICES = ("off", "backbone", "backbone+neck")
_ALIASES = dict.fromkeys(("false", "no", "0"), "off") | dict.fromkeys(
    ("true", "yes", "1"), "backbone+neck"
)


def _choice(value: Any) -> Any:
    """``true``/``false`` (bools or their spellings) as the choice they stand for; anything
    else not a choice refused with the choices."""
    if isinstance(value, bool):
        return "backbone+neck" if value else "off"
    text = str(value).strip().lower()
    text = _ALIASES.get(text, text)
    if text not in CHOICES:
        raise ValueError("not one of false (off), backbone, backbone+neck (or true)")
    return text


class GradCheckpointKeys(BaseModel):
    """``grad_checkpoint``: which blocks recompute their activations in the backward."""

    grad_checkpoint: Annotated[
        Literal["off", "backbone", "backbone+neck"], BeforeValidator(_choice)
    ] = Field(
        "off",
        description="recompute activations in the backward instead of keeping them (less "
        "memory, more compute, the same numbers): off (false), backbone (its stages), "
        "backbone+neck (true: also YOLO's PAN, DETR's hybrid encoder); graph=cuda-graph and "
        "whole-step decline it (docs/models.md)",
    )


GRAD_CHECKPOINT_KEYS = KeyGroup(
    "grad-checkpoint", "activation checkpointing of the family's blocks", GradCheckpointKeys
)


def regions(options: Mapping[str, Any]) -> frozenset[str]:
    """The regions a run's keys ask to checkpoint: ``{"backbone"}``, ``{"backbone", "neck"}``
    or none."""
    from falconet.contract import validated_keys

    value = validated_keys(options, GradCheckpointKeys).grad_checkpoint
    return frozenset() if value == "off" else frozenset(value.split("+"))


def refuse_unsupported(family: Any, options: Mapping[str, Any]) -> None:
    """A :class:`falconet.training.config.ConfigError` where the run asks for a region that
    ``family`` does not declare (``grad_checkpoint_regions``)."""
    wanted = regions(options)
    offered = frozenset(getattr(family, "grad_checkpoint_regions", ()))
    if wanted - offered:
        from falconet.training.config import ConfigError

        has = f"checkpoints {', '.join(sorted(offered))} only" if offered else "checkpoints none"
        raise ConfigError(
            f"grad_checkpoint={options.get('grad_checkpoint')}: the {family.name} family {has}"
        )


def checkpoint(block: Callable[..., Any], *inputs: torch.Tensor) -> Any:
    """``block(*inputs)``, its activations recomputed in the backward where it trains with
    gradients on (``block`` a module; elsewhere, as in evaluation, a plain call).

    In eager mode BatchNorm's running statistics of ``block`` are put back after the
    recomputation. Under ``torch.compile`` the compiler records the buffers' updates once, in
    the forward, and recomputes only what the backward reads (the contexts are left out:
    Dynamo takes only its own)."""
    import torch
    from torch.utils.checkpoint import checkpoint as recompute

    if not (torch.is_grad_enabled() and getattr(block, "training", True)):
        return block(*inputs)
    if torch.compiler.is_compiling():
        return recompute(block, *inputs, use_reentrant=False)
    return recompute(
        block,
        *inputs,
        use_reentrant=False,
        preserve_rng_state=True,
        context_fn=lambda: (nullcontext(), _KeptRunningStats(block)),
    )


class _KeptRunningStats:
    """Around the recomputation: ``block``'s BatchNorm buffers as the forward left them."""

    def __init__(self, block: Any) -> None:
        self.block = block
        self.kept: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __enter__(self) -> None:
        from torch.nn.modules.batchnorm import _BatchNorm

        modules = self.block.modules() if hasattr(self.block, "modules") else ()
        self.kept = [
            (buffer, buffer.clone())
            for m in modules
            if isinstance(m, _BatchNorm) and m.training and m.track_running_stats
            for buffer in (m.running_mean, m.running_var, m.num_batches_tracked)
            if buffer is not None
        ]

    def __exit__(self, *exc: object) -> None:
        for buffer, kept in self.kept:
            buffer.copy_(kept)
        self.kept = []
