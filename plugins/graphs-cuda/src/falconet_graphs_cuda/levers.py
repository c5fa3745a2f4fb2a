"""The levers of falconet-graphs-cuda, registered through ``register_levers``.

``graph=cuda-graph`` and ``graph=whole-step`` for a step that waits for the host to launch
kernels; ``bn_silu=triton`` and ``fuse=inductor-loss`` for a busy GPU that already replays the
whole step. What each measured and how its accuracy was checked is in docs/performance.md.
"""

from __future__ import annotations

from falconet.levers import LeverContext, Suggestion, lever
from falconet_graphs_cuda.keys import GraphsCudaKeys

GRAPHS = ("cuda-graph", "whole-step")

FUSED_STEP = (
    "fuse=inductor-loss with bn_silu=triton is the fastest whole step that kept the mAP on the "
    "fp16 overfit check; not bit for bit: check the mAP of your own run with the overfit check "
    "(docs/performance.md, 'Keys of graph=whole-step')"
)
"""What the fastest step that kept the mAP is (the fused levers' reason quotes it; what it
measured is in docs/performance.md and the lab log it links). ``fuse=inductor-all``, which
compiles the network too, is not suggested: it is slower than these two, and it lowered the
mAP on the bf16 overfit check."""

BF16_CHECKED = (
    "; in bf16 (this run) the two were checked together only, and the overfit check was not "
    "conclusive: check the mAP of a bf16 run"
)


@lever(
    "cuda-graph", "graph=cuda-graph: the network replayed from CUDA graphs", ("host-launch",), 30
)
def cuda_graph(c: LeverContext) -> Suggestion | None:
    if c.graph in GRAPHS:
        return None
    why = (
        "replay the network's forward and backward from CUDA graphs: one launch per graph "
        "instead of one per kernel"
    )
    return Suggestion("graph", "cuda-graph", why)


@lever("whole-step", "graph=whole-step: loss, optimizer and EMA replayed too", ("host-launch",), 25)
def whole_step(c: LeverContext) -> Suggestion | None:
    if c.graph == "whole-step":
        return None
    why = (
        "replay the loss, optimizer and EMA from graphs as well (a static-shaped loss such as "
        "yolo with assigner=tal; fp16 with sgd only)"
    )
    return Suggestion("graph", "whole-step", why)


def _fused_step(c: LeverContext) -> GraphsCudaKeys | None:
    """The run's keys where the fused levers apply: a whole step replayed on a GPU in half
    precision, whose network Inductor does not compile (``fuse=inductor``, ``inductor-all``
    run Inductor's BatchNorm, with which ``bn_silu=triton`` does not combine)."""
    if c.graph != "whole-step" or c.device != "cuda" or c.precision == "fp32":
        return None
    keys = c.keys(GraphsCudaKeys)
    return None if keys.fuse in ("inductor", "inductor-all") else keys


def _caveat(c: LeverContext) -> str:
    return "" if c.precision == "fp16" else BF16_CHECKED


@lever("bn-silu-triton", "bn_silu=triton: BatchNorm and SiLU as one Triton op", ("compute",), 4)
def bn_silu_triton(c: LeverContext) -> Suggestion | None:
    keys = _fused_step(c)
    if keys is None or keys.bn_silu == "triton":
        return None
    why = (
        "BatchNorm and SiLU as one op on Triton kernels, fewer bytes moved (most with bf16, "
        "where PyTorch runs its own BatchNorm kernels instead of cuDNN's); "
        + FUSED_STEP
        + _caveat(c)
    )
    return Suggestion("bn_silu", "triton", why)


@lever("fuse-inductor-loss", "fuse=inductor-loss: the loss compiled", ("compute",), 3)
def fuse_inductor_loss(c: LeverContext) -> Suggestion | None:
    keys = _fused_step(c)
    if keys is None or keys.fuse != "none":
        return None
    why = (
        "compile the loss and its assigner with Inductor inside the captured step: fewer, "
        "fused kernels, a compilation per target bucket at the start; " + FUSED_STEP + _caveat(c)
    )
    return Suggestion("fuse", "inductor-loss", why)


LEVERS = (cuda_graph, whole_step, bn_silu_triton, fuse_inductor_loss)
