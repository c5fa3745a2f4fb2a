"""Which of the plugin's modes (its keys, :mod:`falconet_graphs_cuda.keys`) apply to a run.

``wgrad_stream`` needs CUDA and a network that is not compiled; ``bn_silu=triton`` needs CUDA,
Triton, and a network that ``fuse`` does not compile. The static step
(:mod:`falconet_graphs_cuda.static_step`) asks these before it builds its forward.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from falconet_graphs_cuda.bn_silu import FusedBatchNormSiLU

if TYPE_CHECKING:
    from falconet_graphs_cuda.keys import GraphsCudaKeys

log = logging.getLogger("falconet.train")


COMPILED_NETWORK = ("inductor", "inductor-all")  # the fuse values that compile the network


def side_stream_applies(cfg: GraphsCudaKeys, device: torch.device) -> bool:
    """Whether the convolutions' weight gradients run on a second stream
    (:mod:`falconet_graphs_cuda.side_weight_grads`): asked for (``wgrad_stream``), on CUDA, and
    with the network not compiled. Inductor compiles a network around the custom op into
    another fused step than the one whose accuracy was measured, and that one was not bit for
    bit it and lower on the overfit check (docs/performance.md)."""
    return bool(cfg.wgrad_stream) and device.type == "cuda" and cfg.fuse not in COMPILED_NETWORK


def fused_bn_silu(cfg: GraphsCudaKeys, device: torch.device) -> FusedBatchNormSiLU | None:
    """The function mode that runs BatchNorm and SiLU as one Triton op (``bn_silu=triton``,
    :mod:`falconet_graphs_cuda.bn_silu`), or None for PyTorch's kernels."""
    if cfg.bn_silu != "triton":
        return None
    if device.type != "cuda":
        log.info("bn_silu=triton: Triton kernels need a CUDA device; BatchNorm runs as PyTorch's")
        return None
    if cfg.fuse in COMPILED_NETWORK:  # TorchDynamo traces the family's own forms, not the mode
        raise ValueError(
            f"bn_silu=triton with fuse={cfg.fuse}: Inductor compiles the network with its own "
            "BatchNorm and SiLU kernels, and a compiled network does not take the fused op; "
            "use bn_silu=triton with fuse=none or fuse=inductor-loss, or fuse alone"
        )
    try:
        import triton  # noqa: F401  (the kernels' compiler; torch's CUDA builds carry it)
    except ImportError as error:
        raise RuntimeError(
            "bn_silu=triton needs the triton package (pip install triton, the version your "
            "torch build names), or train with bn_silu=native"
        ) from error
    log.warning(
        "bn_silu=triton: BatchNorm and SiLU run as one Triton op, which agrees with PyTorch's "
        "kernels to rounding, not bit for bit: check your accuracy before keeping it"
    )
    return FusedBatchNormSiLU()
