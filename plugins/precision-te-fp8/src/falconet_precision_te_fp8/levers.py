"""The lever of falconet-precision-te-fp8, registered through ``register_levers``:
``amp_dtype=fp8`` for a GPU busy with a half-precision step."""

from __future__ import annotations

from falconet.levers import LeverContext, Suggestion, lever

NAME = "fp8"
"""The precision backend's name (``amp_dtype=fp8``)."""


@lever("fp8", "amp_dtype=fp8: FP8 Tensor Cores through Transformer Engine", ("compute",), 2)
def fp8(c: LeverContext) -> Suggestion | None:
    """From bf16 or fp16 on a GPU; an fp32 run moves to a half precision first (the core's
    lever), and one already in fp8 has nothing to gain here."""
    if c.device != "cuda" or c.precision in ("fp32", NAME) or NAME not in c.precision_backends:
        return None
    return Suggestion("amp_dtype", NAME, "FP8 Tensor Cores (Hopper and later)")


LEVERS = (fp8,)
