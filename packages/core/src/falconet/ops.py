"""Compound ops a family's network calls, which a backend may replace with its own kernels.

A family writes ``ops.batch_norm_silu(x, bn)`` where it would write ``F.silu(bn(x))``; run as
is, that is what it computes. Each op goes through torch's function-mode protocol
(:func:`torch.overrides.handle_torch_function`), so a backend replaces it for the duration of
a ``with`` block by entering a :class:`torch.overrides.TorchFunctionMode` that answers for it,
with no change to the family and no registry: ``falconet-graphs-cuda``'s whole step does so
with a fused Triton kernel (``bn_silu=triton``), whose outputs also go straight into their
place in a channel concatenation (:func:`concat_buffer`, :func:`concat_channels`). A mode
that does not know an op calls it through, as modes do for every torch function.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import handle_torch_function, has_torch_function


def batch_norm_silu(
    x: torch.Tensor,
    bn: nn.Module,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``silu(bn(x))``: a BatchNorm module, then SiLU, out of place; plus ``residual`` when one
    is given (``residual + silu(bn(x))``, a residual block's end).

    ``out``: a slice of a buffer from :func:`concat_buffer`, where a backend that made the
    buffer may write the result instead of allocating it (:func:`concat_channels` then finds
    it in place). Run as is there is no such buffer, and ``out`` is None."""
    if has_torch_function((x,)):
        return handle_torch_function(batch_norm_silu, (x,), x, bn, residual, out)
    y = F.silu(bn(x))
    return y if residual is None else residual + y


def concat_buffer(like: torch.Tensor, channels: int) -> torch.Tensor | None:
    """A buffer of ``channels`` channels, shaped and typed as ``like`` otherwise, into which
    the producers of a channel concatenation write their parts (``out=`` of
    :func:`batch_norm_silu`) so that :func:`concat_channels` need not copy them, or None
    where nothing writes in place. Run as is: None, the parts are concatenated by copying."""
    if has_torch_function((like,)):
        return handle_torch_function(concat_buffer, (like,), like, channels)
    return None


def concat_channels(
    parts: Sequence[torch.Tensor], buffer: torch.Tensor | None = None
) -> torch.Tensor:
    """``torch.cat(parts, 1)``. A backend that made ``buffer`` (:func:`concat_buffer`) returns
    it without a copy when every part already lies in it, in order."""
    if has_torch_function(tuple(parts)):
        return handle_torch_function(concat_channels, tuple(parts), parts, buffer)
    return torch.cat(tuple(parts), 1)
