"""Compound ops a family's network calls, which a backend may replace with its own kernels.

A family writes ``ops.batch_norm_silu(x, bn)`` where it would write ``F.silu(bn(x))``; run as
is, that is what it computes. Each op goes through torch's function-mode protocol
(:func:`torch.overrides.handle_torch_function`), so a backend replaces it for the duration of
a ``with`` block by entering a :class:`torch.overrides.TorchFunctionMode` that answers for it,
with no change to the family and no registry: ``falconet-graphs-cuda``'s whole step does so
with a fused Triton kernel (``bn_silu=triton``). A mode that does not know an op calls it
through, as modes do for every torch function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import handle_torch_function, has_torch_function


def batch_norm_silu(x: torch.Tensor, bn: nn.Module) -> torch.Tensor:
    """``silu(bn(x))``: a BatchNorm module, then SiLU, out of place."""
    if has_torch_function((x,)):
        return handle_torch_function(batch_norm_silu, (x,), x, bn)
    return F.silu(bn(x))
