"""The built-in ``eager`` graph backend: the network is called as it is.

It never declines, so it is what every other backend falls back to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from falconet.interfaces import DispatchContext

if TYPE_CHECKING:
    from torch import nn


class EagerDispatch:
    """Call the network directly, op by op."""

    name = "eager"
    summary = "call the network op by op (the fallback of every other backend)"

    def decline_reason(self, context: DispatchContext) -> str | None:
        return None

    def wrap(self, network: nn.Module, context: DispatchContext) -> Callable[..., Any]:
        return network
