"""Which layers of a network FP8 can take: plain ``nn.Linear`` layers whose features suit
Transformer Engine's FP8 products (multiples of 16, at least ``fp8_min_dim``). Convolutions
have no FP8 path in Transformer Engine, so a convolutional network has no candidate at all."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

ALIGNMENT = 16
"""FP8 GEMMs need both matrix sides in multiples of 16."""


@dataclass(frozen=True)
class Layer:
    """A linear layer of the network: its module path, its features, and why it stays bf16
    (``None``: eligible; the measurement may still keep it)."""

    name: str
    in_features: int
    out_features: int
    skipped: str | None = None


def linear_layers(model: nn.Module, min_dim: int) -> list[Layer]:
    """Every ``nn.Linear`` of ``model`` (exactly that class: a subclass may do more than a
    product), with the reason it is skipped where it is."""
    layers = []
    for name, module in model.named_modules():
        if type(module) is not nn.Linear:
            continue
        fin, fout = module.in_features, module.out_features
        reason = None
        if fin % ALIGNMENT or fout % ALIGNMENT:
            reason = f"features {fin} -> {fout} not multiples of {ALIGNMENT}"
        elif min(fin, fout) < min_dim:
            reason = f"features {fin} -> {fout} under fp8_min_dim={min_dim}"
        layers.append(Layer(name, fin, fout, reason))
    return layers
