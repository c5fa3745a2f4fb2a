"""The ``cuda-graph`` graph backend: the family's capture region, forward and backward, replayed
from CUDA graphs; loss, optimizer and EMA stay eager.

It declines (the trainer logs the reason and continues with ``graph=eager``) on a device other
than CUDA, in a distributed run (DDP's gradient hooks fire during backward, which a replay
would skip) and for a family that declares no capture region.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from falconet.interfaces import DispatchContext

if TYPE_CHECKING:
    from torch import nn

CAPTURE_AFTER = 3
"""A shape is recorded on its third call: the first calls warm the allocator and cuDNN, and a
shape seen once (a partial last batch) never pays for a capture."""


class CudaGraphDispatch:
    """Record the network per input shape after it repeats; replay the recording."""

    name = "cuda-graph"
    summary = "CUDA-graph capture of the network's forward and backward, per input shape"

    def decline_reason(self, context: DispatchContext) -> str | None:
        if context.device.type != "cuda":
            return f"CUDA graphs need a CUDA device, and this run is on {context.device.type}"
        if context.world_size > 1:
            return "CUDA graphs would skip DDP's gradient hooks in a distributed run"
        if context.capture_region is None:
            return "the model family declares no capture region"
        return None

    def wrap(self, network: nn.Module, context: DispatchContext) -> Callable[..., Any]:
        from falconet_graphs_cuda.graphed import GraphedNetwork
        from falconet_graphs_cuda.recording import CudaRecorder

        return GraphedNetwork(network, CudaRecorder(), capture_after=CAPTURE_AFTER)
