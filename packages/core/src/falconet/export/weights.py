"""Which weights of a checkpoint an export writes: the EMA's by default, the raw ones on request.

``last.pt`` holds both (``model``: raw; ``ema``: the EMA's, where the run kept one); ``best.pt``
holds one set, ``weights``: the EMA's when the run kept an EMA (``config.ema``), else the raw
weights (:mod:`falconet.training.checkpoint`).
"""

from __future__ import annotations

from typing import Any

from falconet.export.options import ExportError


def weight_sets(checkpoint: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """``{"ema": state dict or None, "raw": state dict or None}`` of a loaded checkpoint."""
    if "model" in checkpoint:  # last.pt: the run's full state
        ema = checkpoint.get("ema")
        return {"ema": ema["state"] if ema else None, "raw": checkpoint["model"]}
    kept_ema = bool(checkpoint.get("config", {}).get("ema", False))
    weights = checkpoint["weights"]
    return {"ema": weights if kept_ema else None, "raw": None if kept_ema else weights}


def choose_weights(
    checkpoint: dict[str, Any], asked: str | None, where: str
) -> tuple[str, dict[str, Any]]:
    """``(which, state dict)``: ``asked`` (``ema``, ``raw``), or with ``None`` the EMA's where
    ``checkpoint`` (read from ``where``) holds them, else the raw weights."""
    sets = weight_sets(checkpoint)
    which = asked or ("ema" if sets["ema"] is not None else "raw")
    state = sets[which]
    if state is not None:
        return which, state
    if which == "ema":
        raise ExportError(
            f"weights=ema: {where} holds no EMA weights (it was trained with ema=false); "
            "export its weights with weights=raw"
        )
    raise ExportError(
        f"weights=raw: {where} holds only the EMA weights (best.pt keeps the weights that "
        "validation scored); the raw weights are in last.pt beside it: "
        "model=.../weights/last.pt weights=raw"
    )
