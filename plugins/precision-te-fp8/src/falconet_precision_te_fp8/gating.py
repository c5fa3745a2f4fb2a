"""Gating by measurement: a layer converts to FP8 only where its product, timed at the run's
shapes, beats bf16, so ``amp_dtype=fp8`` is never slower than bf16 layer for layer.

A probe forward of the unconverted network on an input of the run's shape records how many
rows (tokens) each linear layer multiplies; each distinct ``(rows, in, out)`` is then timed
once, forward and backward, in bf16 and in FP8 (``te_modules.time_product``), and the times
are cached on disk per GPU, Transformer Engine version, recipe and way of timing, so later runs
start without measuring again.

The way of timing follows the run's graph backend, as it declares itself
(``PrecisionContext.replays``): a step that replays a recording pays the kernels alone, so the
products are timed as replays of a recorded pass; one that launches every kernel from the host
(``eager``, ``compile``) is timed as launched.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from falconet_precision_te_fp8.eligibility import Layer

log = logging.getLogger("falconet.train")

MARGIN = 0.05
"""FP8 must beat bf16 by this fraction to convert: a tie is noise, and bf16 is exact-er."""


@dataclass(frozen=True)
class Product:
    """One layer's matrix product: ``rows x in_features`` times ``in_features x out``."""

    rows: int
    in_features: int
    out_features: int

    @property
    def key(self) -> str:
        return f"{self.rows}x{self.in_features}x{self.out_features}"


@dataclass(frozen=True)
class Timing:
    """Forward + backward milliseconds of one product in bf16 and in FP8; ``replayed``: timed
    as CUDA-graph replays (the kernels alone), else as launched (host time included)."""

    bf16_ms: float
    fp8_ms: float
    replayed: bool = False

    @property
    def speedup(self) -> float:
        return self.bf16_ms / self.fp8_ms


def layer_rows(model: nn.Module, names: Iterable[str], example: torch.Tensor) -> dict[str, int]:
    """Rows each named linear layer multiplies in one training forward of ``example`` (the
    largest, where a layer runs more than once). The model's buffers are put back afterwards:
    a training forward updates BatchNorm's running statistics, and a probe must not leave the
    run's network other than it found it."""
    rows: dict[str, int] = {}
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    modules = dict(model.named_modules())
    hooks = []
    for name in names:

        def record(module, inputs, name=name):
            x = inputs[0]
            rows[name] = max(rows.get(name, 0), x.numel() // x.shape[-1])

        hooks.append(modules[name].register_forward_pre_hook(record))
    try:
        with torch.no_grad(), torch.autocast(example.device.type, dtype=torch.bfloat16):
            model(example)
    finally:
        for hook in hooks:
            hook.remove()
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
    return rows


def choose(
    layers: list[Layer], rows: dict[str, int], timings: dict[str, Timing], force: bool
) -> dict[str, str | None]:
    """For each layer, ``None`` (convert) or why it stays bf16. ``force`` (``fp8_layers=all``)
    converts every eligible layer the forward used."""
    decisions: dict[str, str | None] = {}
    for layer in layers:
        if layer.skipped:
            decisions[layer.name] = layer.skipped
        elif layer.name not in rows:
            decisions[layer.name] = "not used by the training forward"
        elif force:
            decisions[layer.name] = None
        else:
            timing = timings[Product(rows[layer.name], layer.in_features, layer.out_features).key]
            if timing.fp8_ms < timing.bf16_ms * (1 - MARGIN):
                decisions[layer.name] = None
            else:
                how = "replayed" if timing.replayed else "launched"
                decisions[layer.name] = (
                    f"fp8 {timing.fp8_ms:.3f} ms, bf16 {timing.bf16_ms:.3f} ms at "
                    f"{rows[layer.name]} rows ({how})"
                )
    return decisions


def products(layers: list[Layer], rows: dict[str, int]) -> list[Product]:
    """The distinct products of the eligible layers the forward used."""
    found = {
        Product(rows[x.name], x.in_features, x.out_features)
        for x in layers
        if x.skipped is None and x.name in rows
    }
    return sorted(found, key=lambda p: p.key)


class TimingCache:
    """Measured products in a JSON file, one per GPU, Transformer Engine version and recipe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, Timing] = {}
        if path.exists():
            try:
                raw = json.loads(path.read_text())
                self.entries = {k: Timing(**v) for k, v in raw.items()}
            except (ValueError, TypeError) as exc:  # a torn or foreign file: measure again
                log.warning("fp8: ignoring the timing cache %s (%s)", path, exc)

    @classmethod
    def for_run(cls, device_name: str, te_version: str, recipe: str, replayed: bool) -> TimingCache:
        root = Path(os.environ.get("FALCONET_CACHE_DIR", Path.home() / ".cache" / "falconet"))
        slug = "".join(c if c.isalnum() else "-" for c in device_name).strip("-").lower()
        how = "replayed" if replayed else "launched"
        return cls(root / f"fp8-products-{slug}-te{te_version}-{recipe}-{how}.json")

    def measure(
        self, wanted: list[Product], time_product: Callable[[Product], Timing]
    ) -> dict[str, Timing]:
        """Timings of ``wanted``: cached ones read, the others measured and saved (atomically)."""
        missing = [p for p in wanted if p.key not in self.entries]
        for product in missing:
            self.entries[product.key] = time_product(product)
        if missing:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(
                json.dumps({k: vars(v) for k, v in sorted(self.entries.items())}, indent=1)
            )
            temporary.replace(self.path)
        return {p.key: self.entries[p.key] for p in wanted}
