"""The keys of ``falconet export`` and ``Detector.export``, typed and checked before any work."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

FORMATS = ("onnx",)
DEFAULT_OPSET = 17
"""Recent enough for every operator the shipped families use (DETR's grid_sample needs 16) and
read by every current ONNX runtime (onnxruntime, TensorRT, OpenVINO)."""


class ExportError(ValueError):
    """An export that cannot be done as asked; the message says what is wrong and what to do."""


class ParityError(ExportError):
    """The written file's outputs differ from PyTorch's beyond the stated tolerance."""


class ExportOptions(BaseModel):
    """Every key of an export (docs/cli.md, "falconet export")."""

    model_config = ConfigDict(extra="forbid")

    format: str = Field("onnx", description="file format: onnx")
    opset: int = Field(DEFAULT_OPSET, description="ONNX opset (from the family's minimum up)")
    dynamic: bool = Field(False, description="a dynamic batch dimension (else fixed at batch)")
    batch: int = Field(1, ge=1, description="the batch size of a fixed-batch graph")
    imgsz: int | None = Field(
        None, ge=32, description="square input size, a multiple of 32 (default: the trained one)"
    )
    weights: Literal["ema", "raw"] | None = Field(
        None, description="ema or raw weights (default: ema where the checkpoint holds them)"
    )
    out: str | None = Field(None, description="the file to write (default: the .pt's, .onnx)")
    check: bool = Field(True, description="compare the file's outputs with PyTorch's")
    source: str | None = Field(
        None, description="images or a folder for the check (default: generated shapes)"
    )

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value.lower() not in FORMATS:
            raise ValueError(
                "falconet exports format=onnx only; TensorRT, OpenVINO and other runtimes "
                "build their formats from the ONNX file (trtexec --onnx=best.onnx)"
            )
        return value.lower()

    @field_validator("imgsz")
    @classmethod
    def _stride_multiple(cls, value: int | None) -> int | None:
        if value is not None and value % 32:
            raise ValueError(f"must be a multiple of 32 (e.g. {round(value / 32) * 32 or 32})")
        return value


def parse_options(keys: Mapping[str, Any]) -> ExportOptions:
    """``keys`` (CLI text or Python values) validated; unknown keys and bad values named."""
    unknown = sorted(set(keys) - set(ExportOptions.model_fields))
    if unknown:
        raise ExportError(
            f"unknown export key(s) {', '.join(unknown)}; export takes model= and "
            + ", ".join(f"{k}=" for k in ExportOptions.model_fields)
        )
    try:
        return ExportOptions.model_validate(dict(keys))
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            key = str(error["loc"][0]) if error["loc"] else "?"
            message = error["msg"].removeprefix("Value error, ")
            if error.get("ctx", {}).get("expected"):
                message = f"expected {error['ctx']['expected']}"
            problems.append(f"{key}={keys.get(key)!r}: {message}")
        raise ExportError("; ".join(problems)) from None
