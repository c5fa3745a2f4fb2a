"""The one set of training keys, shared by ``Detector.train(**keys)`` and ``falconet train k=v``.

:class:`TrainConfig` is a pydantic model: types, ranges and allowed values are declared once
here and every key carries its meaning (``falconet train --help`` prints them). Values resolve
in four layers, lowest first: the defaults below, the model family's recipe
(``ModelFamily.default_recipe``), the dataset's ``train_defaults:`` (a mapping a data yaml may
hold, such as the built-in ``shapes`` set's small image size), and what the user passes.
Names that plugins provide (``amp_dtype``, ``graph``, ``assigner``, ``eval_backend``,
``callbacks``, and the ``profiler`` callback behind ``profile``) are checked against the
registries when the run is set up, so a missing plugin is reported with its install command.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class ConfigError(ValueError):
    """A key that does not exist or a value that is not allowed; the message says which."""


class TrainConfig(BaseModel):
    """Every key of a training run (see ``docs/training.md``)."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, validate_assignment=True)

    # what to train on what
    model: str = Field("yolo-n", description="model name (yolo-n, ...) or a checkpoint .pt")
    data: str = Field("shapes", description="`shapes` (built-in synthetic set) or a data yaml")
    epochs: int = Field(100, ge=1, description="number of epochs")
    batch: int = Field(16, ge=1, description="images per step")
    imgsz: int = Field(640, ge=32, description="square input size in pixels, a multiple of 32")
    device: str = Field("auto", description="auto, cpu, 0, cuda:0 (auto: the first GPU, else cpu)")
    workers: int = Field(8, ge=0, description="loader worker processes (capped at the CPU count)")
    cache: Literal["none", "ram", "disk"] = Field(
        "none", description="decoded-image cache: none, ram or disk (in the cache folder)"
    )
    fraction: float = Field(
        1.0, gt=0, le=1, description="train on this leading fraction of the train split"
    )
    # how the step runs
    amp_dtype: str = Field(
        "auto", description="precision backend: auto (bf16 where supported), bf16, fp16, fp32"
    )
    graph: str = Field(
        "auto",
        description="graph backend: auto (whole-step, else cuda-graph, else eager: the first "
        "that applies), eager, compile, cuda-graph, whole-step",
    )
    compile_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = Field(
        "default", description="torch.compile mode for graph=compile"
    )
    fuse: Literal["none", "inductor", "inductor-loss", "inductor-all"] = Field(
        "none",
        description="graph=whole-step: Inductor compiles, before capture, the network "
        "(inductor: BatchNorm, SiLU and copies fused), the loss with its assigner "
        "(inductor-loss) or both (inductor-all); faster, but not bit for bit, slower to start "
        "and lower mAP on the overfit check (docs/performance.md)",
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
    assigner: str = Field("tal", description="label assigner: tal, simota, hungarian")
    # optimisation
    optimizer: Literal["sgd", "adamw"] = Field("sgd", description="sgd or adamw")
    lr0: float = Field(0.01, gt=0, description="initial learning rate")
    lrf: float = Field(0.01, gt=0, le=1, description="final learning rate, as a fraction of lr0")
    schedule: Literal["linear", "cosine"] = Field("linear", description="lr decay after warm-up")
    momentum: float = Field(0.937, ge=0, lt=1, description="SGD momentum / AdamW beta1")
    nesterov: bool = Field(True, description="Nesterov momentum (sgd)")
    weight_decay: float = Field(5e-4, ge=0, description="weight decay, scaled by batch / nbs")
    decay_norm_and_bias: bool = Field(False, description="apply weight decay to norms and biases")
    warmup_epochs: float = Field(3.0, ge=0, description="linear warm-up length in epochs")
    warmup_momentum: float = Field(0.8, ge=0, lt=1, description="momentum at warm-up start")
    warmup_bias_lr: float = Field(0.1, ge=0, description="bias lr at warm-up start")
    nbs: int = Field(
        64, ge=1, description="nominal batch: gradients accumulate to about this many images"
    )
    clip_grad: float = Field(10.0, ge=0, description="max gradient norm (0: no clipping)")
    ema: bool = Field(True, description="keep an exponential moving average of the weights")
    ema_decay: float = Field(0.9999, gt=0, lt=1, description="EMA decay (ramped up at start)")
    ema_tau: float = Field(2000.0, gt=0, description="EMA ramp: decay * (1 - exp(-updates/tau))")
    # augmentation
    mosaic: float = Field(1.0, ge=0, le=1, description="probability of a 4-image mosaic")
    close_mosaic: int = Field(10, ge=0, description="turn mosaic off for the last N epochs")
    degrees: float = Field(0.0, ge=0, description="random rotation range, degrees")
    translate: float = Field(0.1, ge=0, le=1, description="random translation, fraction of size")
    scale: float = Field(0.5, ge=0, lt=1, description="random scale gain in [1-scale, 1+scale]")
    hsv_h: float = Field(0.015, ge=0, le=1, description="hue jitter")
    hsv_s: float = Field(0.7, ge=0, le=1, description="saturation jitter")
    hsv_v: float = Field(0.4, ge=0, le=1, description="value jitter")
    fliplr: float = Field(0.5, ge=0, le=1, description="probability of a horizontal flip")
    # validation, stopping
    val: bool = Field(True, description="validate during training")
    val_interval: int = Field(1, ge=1, description="validate every N epochs (and the last)")
    eval_backend: str = Field(
        "auto", description="COCO evaluator: auto (fastest installed), pycocotools, ..."
    )
    metric: Literal["map50-95", "map50", "fitness"] = Field(
        "fitness", description="best.pt and early-stopping metric (fitness: 0.1 mAP50 + 0.9 mAP)"
    )
    patience: int = Field(50, ge=0, description="stop after N validations without improvement")
    min_delta: float = Field(0.0, ge=0, description="smallest metric gain that counts")
    conf: float = Field(0.001, ge=0, le=1, description="validation confidence threshold")
    iou: float = Field(0.7, gt=0, le=1, description="validation NMS IoU threshold")
    max_det: int = Field(300, ge=1, description="validation detections per image")
    nan_patience: int = Field(
        5, ge=1, description="stop after N consecutive steps with a non-finite loss"
    )
    # reproducibility, output
    seed: int = Field(0, ge=0, description="seed of weights, batches and augmentation")
    deterministic: bool = Field(True, description="ask torch for deterministic algorithms")
    log_interval: int = Field(10, ge=1, description="read losses back to the host every N steps")
    project: str = Field("runs/train", description="folder holding the run folders")
    name: str = Field("exp", description="run folder name (exp, exp2, ... when taken)")
    exist_ok: bool = Field(False, description="reuse runs/train/<name> instead of a new one")
    resume: bool | str = Field(
        False, description="true (latest last.pt under project) or a path to last.pt"
    )
    plots: bool = Field(True, description="write PNG plots in the run folder")
    callbacks: list[str] = Field(
        default_factory=list, description="extra registered callbacks, comma separated"
    )
    # profiling (falconet-profiler, docs/profiling.md)
    profile: bool = Field(
        False, description="measure a window of steps and say why a step is slow (profiler)"
    )
    profile_warmup: int = Field(
        5, ge=0, description="profile: batches discarded after the first optimizer step"
    )
    profile_steps: int = Field(
        20, ge=2, description="profile: batches measured (half unsynchronised, half synchronised)"
    )
    profile_then_stop: bool = Field(
        False, description="profile: end the run after the window, saving no partial epoch"
    )

    @field_validator("imgsz")
    @classmethod
    def _stride_multiple(cls, value: int) -> int:
        if value % 32:
            raise ValueError(
                f"must be a multiple of 32 (the network's largest stride); "
                f"try {max(32, round(value / 32) * 32)}"
            )
        return value

    @field_validator("resume", mode="before")
    @classmethod
    def _resume_flag(cls, value: Any) -> Any:
        if isinstance(value, str) and value.lower() in _BOOLEANS:
            return _BOOLEANS[value.lower()]
        return value

    @field_validator("callbacks", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    def changed(self, other: TrainConfig) -> dict[str, tuple[Any, Any]]:
        """Keys whose values differ from ``other``: ``{key: (other's, ours)}``."""
        mine, theirs = self.model_dump(), other.model_dump()
        return {k: (theirs[k], v) for k, v in mine.items() if theirs[k] != v}


_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
KEYS = tuple(TrainConfig.model_fields)


def check_keys(keys: Mapping[str, Any], where: str = "key") -> None:
    """Refuse unknown keys, naming the closest known one."""
    for key in keys:
        if key not in TrainConfig.model_fields:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = (
                f"; did you mean {close[0]}=?" if close else "; `falconet train --help` lists all"
            )
            raise ConfigError(f"unknown {where} {key!r}{hint}")


def build_config(*layers: Mapping[str, Any]) -> TrainConfig:
    """Merge ``layers`` (later wins) and validate; errors name the key and what is allowed."""
    merged: dict[str, Any] = {}
    for layer in layers:
        check_keys(layer)
        merged.update(layer)
    try:
        return TrainConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, merged)) from None


def _explain(exc: ValidationError, values: Mapping[str, Any]) -> str:
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"][:1])
        message = error["msg"].removeprefix("Value error, ")
        allowed = error.get("ctx", {}).get("expected")
        if allowed:
            message = f"expected {allowed}"
        lines.append(f"{key}={values.get(key)!r}: {message}")
    return "bad value: " + "; ".join(lines)


def parse_cli_pairs(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``["epochs=3", "data=x.yaml"]`` to ``{"epochs": "3", ...}``; pydantic converts the text."""
    keys: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(
                f"{pair!r} is not key=value (e.g. epochs=50); `falconet train --help` lists keys"
            )
        keys[key.strip().replace("-", "_")] = value.strip()
    return keys


def describe_keys() -> list[tuple[str, str, str]]:
    """``(key, default, meaning)`` for every key, in declaration order (for ``--help``)."""
    rows = []
    for key, field in TrainConfig.model_fields.items():
        shown = format_value(field.get_default(call_default_factory=True))
        rows.append((key, shown, field.description or ""))
    return rows


def format_value(value: Any) -> str:
    """A key's value as it is typed on the command line (``true``, ``a,b``, ``-`` for none)."""
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    return str(value).lower() if isinstance(value, bool) else str(value)
