"""The training keys of falconet-precision-te-fp8, declared through ``register_train_keys``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from falconet.keys import KeyGroup

Recipe = Literal["current", "delayed", "block", "mxfp8", "nvfp4"]


class Fp8Keys(BaseModel):
    """``fp8_recipe``, ``fp8_layers`` and ``fp8_min_dim``: how ``amp_dtype=fp8`` converts."""

    fp8_recipe: Recipe = Field(
        "current",
        description="amp_dtype=fp8: Transformer Engine's scaling recipe: current (per-tensor "
        "scale from this step's values; no history, so resume is exact), delayed (per-tensor "
        "scale from an amax history), block (128-wide blocks); mxfp8 and nvfp4 need a "
        "Blackwell GPU",
    )
    fp8_layers: Literal["auto", "all"] = Field(
        "auto",
        description="amp_dtype=fp8: auto converts a layer only where its FP8 product, measured "
        "at start-up at the run's shapes, beats bf16 (never slower than bf16); all converts "
        "every eligible layer",
    )
    fp8_min_dim: int = Field(
        64,
        ge=16,
        description="amp_dtype=fp8: layers with fewer input or output features stay bf16 "
        "without being measured (quantising costs more than such a product)",
    )


FP8_KEYS = KeyGroup("precision-te-fp8", "how amp_dtype=fp8 chooses and converts layers", Fp8Keys)
