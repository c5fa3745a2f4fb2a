"""The torch versions on which the whole step's half-precision replay was proved exact.

``graph=whole-step`` under fp16 or bf16 records autocast's casts, the gradient scaler's
on-device skip and the optimizer's fused update inside graphs: what it replays depends on
how that torch's autocast caches casts and how its kernels are chosen at capture, which a
new torch release may change without any error. It was checked bit for bit against the
eager step (``tools/check_graphs.py --amp fp16,bf16 --strict``, weights, gradients and
losses of runs whose optimizer stepped) on the torch versions in :data:`PROVED_ON`: the raw
files are ``docs/bench-results/2026-11-30-graphs-check-fp16-64steps.json`` and
``2026-11-30-graphs-check-bf16-emulated-casts.json`` (torch 2.11.0+cu130, H100). On any
other torch the backend declines half-precision runs, so ``graph=auto`` takes the network's
graph (``cuda-graph``) and ``graph=whole-step`` runs eager, with the line saying how to
force the replay (``replay_unproved=true``). fp32's replay is not gated: it records no casts
and no scaler.
"""

from __future__ import annotations

import torch

PROVED_ON: dict[torch.dtype, tuple[str, ...]] = {
    torch.float16: ("2.11",),
    torch.bfloat16: ("2.11",),
}
"""Autocast dtype -> the torch releases (major.minor) its whole-step replay was proved on."""

_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def release(version: str) -> str:
    """``"2.11"`` of ``"2.11.0+cu130"`` (major.minor; pre-release tags dropped)."""
    return ".".join(version.split("+")[0].split(".")[:2])


def unproved_reason(dtype: torch.dtype | None, version: str | None = None) -> str | None:
    """Why the whole step's replay under autocast ``dtype`` is not proved on torch
    ``version`` (default: the running torch's), or ``None`` where it is (or ``dtype`` is not
    gated)."""
    version = str(torch.__version__) if version is None else version
    proved = PROVED_ON.get(dtype) if dtype is not None else None
    if proved is None or release(version) in proved:
        return None
    return (
        f"its {_NAMES[dtype]} replay was checked bit for bit against eager on torch "
        f"{', '.join(proved)} only, and this is torch {version}; replay_unproved=true "
        "replays it anyway (check it: tools/check_graphs.py --strict)"
    )
