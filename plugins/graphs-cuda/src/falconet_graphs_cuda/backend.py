"""The ``cuda-graph`` graph backend: the family's capture region, forward and backward, replayed
from CUDA graphs; loss, optimizer and EMA stay eager.

It declines (the trainer logs the reason and continues with ``graph=eager``) on a device other
than CUDA, for a family that declares no capture region and with ``grad_checkpoint`` on
(``whole-step`` too). In a distributed run the replayed
network is called through DDP: a replay's backward hands each parameter its gradient through
autograd, so DDP's reducer all-reduces the gradients outside the recorded region, as it does
for the eager network. ``whole-step`` records the collectives inside its own graphs instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from falconet.contract import GraphContext

if TYPE_CHECKING:
    from falconet.contract import StepParts, TrainStep

CAPTURE_AFTER = 3
"""A shape is recorded on its third call: the first calls warm the allocator and cuDNN, and a
shape seen once (a partial last batch) never pays for a capture."""


class CudaGraphBackend:
    """Record the network per input shape after it repeats; replay the recording. Replays
    are bit for bit the eager step (docs/performance.md), so ``graph=auto`` may choose it."""

    name = "cuda-graph"
    summary = "CUDA-graph capture of the network's forward and backward, per input shape"
    priority = 10
    replays = True

    def decline_reason(self, context: GraphContext) -> str | None:
        if context.device.type != "cuda":
            return f"CUDA graphs need a CUDA device, and this run is on {context.device.type}"
        if context.capture_region is None:
            return "the model family declares no capture region"
        from falconet.grad_checkpoint import GradCheckpointKeys

        if context.keys(GradCheckpointKeys).grad_checkpoint != "off":
            return (
                "grad_checkpoint recomputes blocks in the backward, and that recomputation "
                "(with the random state it saves and puts back) is not checked inside CUDA "
                "graphs yet"
            )
        return None

    def build_step(self, parts: StepParts, context: GraphContext) -> TrainStep:
        from falconet.graph_backends.eager_step import EagerStep
        from falconet_graphs_cuda.graphed import GraphedNetwork
        from falconet_graphs_cuda.recording import CudaRecorder

        network = GraphedNetwork(parts.model, CudaRecorder(), capture_after=CAPTURE_AFTER)
        return EagerStep(parts, network, network.stats)


class WholeStepBackend:
    """Record the whole step (forward, loss, backward, clip, SGD or AdamW, EMA) per input
    shape and target bucket; replay it. Needs a family whose loss is static-shaped with the
    run's assigner (YOLO with ``tal``). Its default step is bit for bit the eager step with
    SGD (docs/performance.md), so ``graph=auto`` prefers it. In a distributed run the
    gradients' all-reduce and the buffers' broadcast are recorded in the update's graph
    (:mod:`falconet_graphs_cuda.whole_step`)."""

    name = "whole-step"
    summary = "CUDA-graph capture of the whole training step (static-shaped loss)"
    priority = 20
    replays = True

    def decline_reason(self, context: GraphContext) -> str | None:
        if reason := CudaGraphBackend().decline_reason(context):
            return reason
        if not context.static_loss:
            return (
                "the model family declares no static-shaped loss with the run's assigner on "
                "this device (the assigner's static_on)"
            )
        from falconet.precision import autocast_dtype
        from falconet_graphs_cuda.keys import GraphsCudaKeys
        from falconet_graphs_cuda.proved_torch import unproved_reason
        from falconet_graphs_cuda.static_update import unsupported

        if not context.keys(GraphsCudaKeys).replay_unproved and (
            reason := unproved_reason(autocast_dtype(context.precision, context.device))
        ):
            return reason
        return unsupported(context.optimizer, scaled=context.scaler is not None)

    def build_step(self, parts: StepParts, context: GraphContext) -> TrainStep:
        from falconet_graphs_cuda.keys import GraphsCudaKeys
        from falconet_graphs_cuda.recording import CudaStepRecorder
        from falconet_graphs_cuda.whole_step import WholeStep

        keys = context.keys(GraphsCudaKeys)
        return WholeStep(parts, keys, CudaStepRecorder(), capture_after=CAPTURE_AFTER)
