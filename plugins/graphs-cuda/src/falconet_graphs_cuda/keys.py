"""The training keys of falconet-graphs-cuda, declared through ``register_train_keys``.

They apply to ``graph=whole-step`` on a GPU; the core knows nothing of them
(:mod:`falconet.keys`). docs/performance.md says what each lever does and how its accuracy
was checked.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from falconet.keys import KeyGroup


class GraphsCudaKeys(BaseModel):
    """``fuse``, ``wgrad_stream``, ``bn_silu`` and ``replay_unproved``: how the recorded
    whole step is made, and whether it runs on a torch it was not proved on."""

    fuse: Literal["none", "inductor", "inductor-loss", "inductor-all"] = Field(
        "none",
        description="graph=whole-step: Inductor compiles, before capture, the network "
        "(inductor: BatchNorm, SiLU and copies fused), the loss with its assigner "
        "(inductor-loss) or both (inductor-all); faster, not bit for bit, slower to start; "
        "check the accuracy (docs/performance.md)",
    )
    wgrad_stream: bool = Field(
        True,
        description="graph=whole-step on a GPU: the convolutions' weight gradients run on a "
        "second stream, beside the input gradients (the same kernels, the same numbers); not "
        "where fuse compiles the network",
    )
    bn_silu: Literal["native", "triton"] = Field(
        "native",
        description="graph=whole-step on a GPU: BatchNorm and SiLU as PyTorch's kernels "
        "(native) or one fused op on Triton kernels (triton: fewer kernels and passes over "
        "memory, agrees to rounding, not bit for bit; docs/performance.md)",
    )
    replay_unproved: bool = Field(
        False,
        description="graph=whole-step under fp16 or bf16 on a torch release its bit-for-bit "
        "check did not run on (falconet_graphs_cuda.proved_torch): replay anyway instead of "
        "declining (graph=auto then takes cuda-graph)",
    )


GRAPHS_CUDA_KEYS = KeyGroup("graphs-cuda", "how graph=whole-step records the step", GraphsCudaKeys)
