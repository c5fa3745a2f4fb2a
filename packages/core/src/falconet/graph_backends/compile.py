"""The built-in ``compile`` graph backend: ``torch.compile`` on the family's capture region.

``compile_mode`` picks the mode: ``default`` (Inductor kernels), ``reduce-overhead`` (Inductor
plus CUDA graph trees; the wrapper marks each call as a new step, as the trees require) or
``max-autotune-no-cudagraphs`` (autotuned kernels, slow to start). Compilation happens at the
first call; if it fails, the error is logged with what failed and the run continues eager
(the failure surfaces before any weight changed, so falling back is safe). An error later, in
the compiled backward, is not caught: it stops the run with its traceback.

With CUDA graph trees, a parameter's gradient after the first microbatch of an optimizer step
is the backward graph's output itself (autograd takes it as ``param.grad``), and the next
microbatch's replay writes over it before adding to it: with gradient accumulation the run
stopped with "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent
run" (PyTorch issue #169545). So before each call the wrapper gives such gradients their own
storage (:func:`own_grads`); without accumulation the optimizer has dropped them by then and
nothing is copied.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from falconet.contract import GraphContext
from falconet.keys import KeyGroup

if TYPE_CHECKING:
    import torch
    from torch import nn

    from falconet.contract import CaptureStats, StepParts, TrainStep

log = logging.getLogger("falconet.train")

MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


class CompileKeys(BaseModel):
    """The ``compile`` backend's training key."""

    compile_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = Field(
        "default", description="torch.compile mode for graph=compile"
    )


COMPILE_KEYS = KeyGroup("compile", "the compile graph backend's mode", CompileKeys)


class CompileBackend:
    """``torch.compile`` the network (the whole capture region), forward and backward; the
    loss, backward driver and optimizer run as the eager step. Never chosen by ``auto``: it
    compiles at the start and Inductor's kernels round differently from eager."""

    name = "compile"
    summary = "torch.compile the network; compile_mode: " + ", ".join(MODES)
    priority = None
    replays = False  # reduce-overhead's graph trees aside, Inductor's kernels are launched

    def decline_reason(self, context: GraphContext) -> str | None:
        mode = context.keys(CompileKeys).compile_mode
        if context.capture_region is None:
            return "the model family declares no capture region to compile"
        if context.world_size > 1:  # not yet checked against the eager DDP step
            return "compiling under DDP is not built yet (docs/distributed.md)"
        if mode == "reduce-overhead" and context.device.type != "cuda":
            return "compile_mode=reduce-overhead replays CUDA graphs and needs a CUDA device"
        if context.device.type == "cpu" and not any(map(shutil.which, ("c++", "g++", "clang++"))):
            return "Inductor needs a C++ compiler on the CPU and none is on PATH"
        if context.device.type == "cpu" and _autocasts_to_bf16(context):
            # bf16 convolutions flattened and concatenated (the YOLO head) come out of
            # Inductor's CPU kernels wrong, often not finite (docs/lab: the CPU bf16 record)
            return (
                "Inductor's CPU kernels compute bf16 convolution outputs that are flattened and "
                "concatenated wrongly; use amp_dtype=fp32 to compile on the CPU"
            )
        return None

    def build_step(self, parts: StepParts, context: GraphContext) -> TrainStep:
        from falconet.graph_backends.eager_step import EagerStep

        network = CompiledNetwork(parts.model, context.keys(CompileKeys).compile_mode)
        return EagerStep(parts, network, network.stats)


def _autocasts_to_bf16(context: GraphContext) -> bool:
    import torch

    from falconet.precision import autocast_dtype

    return autocast_dtype(context.precision, context.device) == torch.bfloat16


class CompiledNetwork:
    """Calls the compiled network; on a failure of the first (compiling) call, logs it and
    calls the eager network from then on."""

    def __init__(self, network: nn.Module, mode: str) -> None:
        import torch

        self.network = network
        self.mode = mode
        self.compiled = torch.compile(network, mode=mode)
        self.mark_step = mode == "reduce-overhead"
        self.failed: BaseException | None = None
        self._first = True
        self._owned: set[int] = set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        if self.failed is not None:
            return self.network(*args, **kwargs)
        if self.mark_step:
            self._owned = own_grads(self.network.parameters(), self._owned)
            torch.compiler.cudagraph_mark_step_begin()
        if not self._first:
            return self.compiled(*args, **kwargs)
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as exc:  # compile errors come in many types; each is logged
            self.failed = exc
            log.error(
                "graph=compile (mode %s) failed to compile the network: %s: %s; the run "
                "continues with graph=eager",
                self.mode,
                type(exc).__name__,
                str(exc).strip().splitlines()[0] if str(exc).strip() else "",
            )
            return self.network(*args, **kwargs)
        self._first = False
        return out

    def stats(self) -> CaptureStats:
        """A failed compilation counts as a failed capture."""
        from falconet.contract import CaptureStats

        return CaptureStats(failed=int(self.failed is not None))


def own_grads(params: Iterable[torch.Tensor], owned: set[int]) -> set[int]:
    """Copy each ``param.grad`` whose storage is not in ``owned`` (the gradients this function
    made or kept on its last call) into storage of its own; returns the new ``owned``.

    A gradient not seen before is one autograd took from a backward's output as it was (the
    first microbatch after ``zero_grad``), which the next replay overwrites; one seen before
    is the copy, accumulated into in place."""
    kept = set()
    for param in params:
        grad = param.grad
        if grad is None:
            continue
        if grad.data_ptr() not in owned:
            param.grad = grad = grad.clone()
        kept.add(grad.data_ptr())
    return kept
