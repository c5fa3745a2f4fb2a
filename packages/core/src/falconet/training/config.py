"""The one set of training keys, shared by ``Detector.train(**keys)`` and ``falconet train k=v``.

:class:`TrainConfig` is a pydantic model: types, ranges and allowed values are declared once
here and every key carries its meaning (``falconet train --help`` prints them). Values resolve
in four layers, lowest first: the defaults below, the model family's recipe
(``ModelFamily.default_recipe``), the dataset's ``train_defaults:`` (a mapping a data yaml may
hold, such as the built-in ``shapes`` set's small image size), and what the user passes.
Names that plugins provide (``amp_dtype``, ``graph``, ``assigner``, ``eval_backend``,
``callbacks``) are checked against the registries when the run is set up, so a missing plugin
is reported with its install command.

:class:`TrainConfig` holds the core's keys only. A plugin declares its own keys
(:mod:`falconet.keys`); :func:`config_model` makes the run's configuration class from both,
so every function below takes that class (``model``), :class:`TrainConfig` when no plugin
adds keys.
"""

from __future__ import annotations

import difflib
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
)

from falconet.install_hints import known_provider

if TYPE_CHECKING:
    from falconet.plugins import Plugins


class ConfigError(ValueError):
    """A key that does not exist or a value that is not allowed; the message says which."""


class TrainConfig(BaseModel):
    """Every key of a training run (see ``docs/training.md``)."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, validate_assignment=True)

    # what to train on what
    model: str | None = Field(
        None,
        description="model name or a checkpoint .pt; unset: the first model of the installed "
        "family of highest priority (`falconet plugins list` shows the families)",
    )
    data: str = Field("shapes", description="`shapes` (built-in synthetic set) or a data yaml")
    epochs: int = Field(100, ge=1, description="number of epochs")
    batch: int | float = Field(
        16,
        description="images per step, over all ranks; -1 or a fraction such as 0.7: the "
        "largest batch whose step fits in that share of the GPU's free memory (-1: 0.8)",
    )
    imgsz: int = Field(640, ge=32, description="square input size in pixels, a multiple of 32")
    multi_scale: str = Field(
        "false",
        description="train each batch at one size of a set fixed at the start, multiples of "
        "32: true (imgsz ±50%), a fraction (0.25: ±25%), a range of fractions of imgsz "
        "(0.5-1.5: at most 5 sizes, evenly spread) or sizes (320,480,640); drawn from the "
        "seed, validation at imgsz; false: off",
    )
    device: str = Field(
        "auto",
        description="auto, cpu, cuda, 0, cuda:0, or a list of GPUs 0,1 (one process per GPU, "
        "started for you; Detector.train(device=[0, 1])); auto: the first GPU, else cpu",
    )
    workers: int = Field(
        8, ge=0, description="loader worker processes (capped at the cores this process may use)"
    )
    threads: int = Field(
        0,
        ge=0,
        description="CPU threads of torch, OpenMP and OpenCV in the training process (0: the "
        "cores this process may use, affinity and cgroup quota counted, shared by a node's ranks)",
    )
    sync_bn: bool = Field(
        False,
        description="distributed runs on GPUs: BatchNorm normalises over the global batch "
        "(SyncBatchNorm) instead of each rank's share",
    )
    dist_timeout: float = Field(
        600.0,
        gt=0,
        description="distributed runs: seconds a collective waits for the other ranks before "
        "the job fails (a dead rank ends the job instead of hanging it)",
    )
    cache: Literal["auto", "none", "ram", "disk", "gpu", "encoded", "stream"] = Field(
        "auto",
        description="where the training images live: gpu (decoded in GPU memory), encoded "
        "(the files' bytes in host memory, decoded per batch on the GPU), stream (read per "
        "batch, decoded on the GPU), all three augmented on the GPU; ram, disk (decoded, in "
        "the cache folder) or none (read per batch), all three for the CPU workers; auto "
        "(the first of gpu, encoded, stream that fits, logged with the numbers; none off "
        "CUDA)",
    )
    cpu_decode: Literal["auto"] | Annotated[float, Field(ge=0, le=1)] = Field(
        "auto",
        description="cache=encoded and stream: the share of the JPEG files decoded on the "
        "CPU's reader threads beside nvJPEG (0 to 1; auto: from the cores the process may "
        "use per rank, none up to 4, at most 0.75)",
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
        description="graph backend: auto (the installed backend of highest priority that "
        "applies to the run; `falconet plugins list` shows them), eager, compile, ...",
    )
    assigner: str | None = Field(
        None,
        description="label assigner (`falconet plugins list` shows them); unset: the one the "
        "model family's recipe names",
    )
    # optimisation
    optimizer: Literal["sgd", "adamw"] = Field("sgd", description="sgd or adamw")
    lr0: float = Field(0.01, gt=0, description="initial learning rate")
    lrf: float = Field(0.01, gt=0, le=1, description="final learning rate, as a fraction of lr0")
    schedule: Literal["linear", "cosine"] = Field("linear", description="lr decay after warm-up")
    momentum: float = Field(0.937, ge=0, lt=1, description="SGD momentum / AdamW beta1")
    nesterov: bool = Field(True, description="Nesterov momentum (sgd)")
    weight_decay: float = Field(5e-4, ge=0, description="weight decay, scaled by batch / nbs")
    decay_norm_and_bias: bool = Field(False, description="apply weight decay to norms and biases")
    backbone_lr_scale: float = Field(
        1.0, gt=0, le=1, description="lr of the model's `backbone` submodule, as a fraction of lr"
    )
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
    augment: str = Field(
        "default",
        description="augmentation preset: default (the family's recipe), none (or false: "
        "all off), light, heavy; sets the keys below, which win where also given",
    )
    mosaic: float = Field(1.0, ge=0, le=1, description="probability of a 4-image mosaic")
    close_mosaic: int = Field(10, ge=0, description="turn mosaic off for the last N epochs")
    degrees: float = Field(0.0, ge=0, description="random rotation range, degrees")
    translate: float = Field(0.1, ge=0, le=1, description="random translation, fraction of size")
    shear: float = Field(0.0, ge=0, lt=90, description="random shear range, degrees (x and y)")
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
    metric: Literal[
        "fitness", "map50-95", "map50", "map75", "mar1", "mar10", "mar100", "mars", "marm", "marl"
    ] = Field(
        "fitness",
        description="best.pt and early-stopping metric: any of the validator's mAP / mAR stats "
        "(map50-95, map50, map75, mar1, mar10, mar100, mars, marm, marl) or fitness (0.1 "
        "mAP50 + 0.9 mAP50-95)",
    )
    val_weights: Literal["ema", "raw"] = Field(
        "ema",
        description="the weights validation scores and best.pt keeps: the EMA's (raw where the "
        "run keeps no EMA) or the raw model's",
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

    @field_validator("augment", mode="before")
    @classmethod
    def _augment_preset(cls, value: Any) -> str:
        from falconet.training.augment_presets import preset_name

        return preset_name(value)

    @field_validator("imgsz")
    @classmethod
    def _stride_multiple(cls, value: int) -> int:
        if value % 32:
            raise ValueError(
                f"must be a multiple of 32 (the network's largest stride); "
                f"try {max(32, round(value / 32) * 32)}"
            )
        return value

    @field_validator("multi_scale", mode="before")
    @classmethod
    def _size_set(cls, value: Any, info: ValidationInfo) -> str:
        from falconet.training.multi_scale import canonical, size_set

        spec = canonical(value)
        if "imgsz" in info.data:  # a bad imgsz is reported on its own
            size_set(spec, info.data["imgsz"])
        return spec

    @field_validator("batch")
    @classmethod
    def _images_or_share(cls, value: int | float) -> int | float:
        if value == int(value) and (value >= 1 or value == -1):
            return int(value)
        if 0 < value < 1:
            return float(value)
        raise ValueError(
            f"{value:g} is neither a number of images (1 or more) nor autobatch (-1, or a share "
            "of the GPU's free memory between 0 and 1, such as 0.7)"
        )

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
        objects = [v for v in value if not isinstance(v, str)] if isinstance(value, list) else []
        if objects:  # the same keys run in spawned workers (device=0,1): names cross, objects not
            raise ValueError(
                f"callbacks= takes the names of registered callbacks, and {objects[0]!r} is an "
                "object: register its factory through a plugin's register_callbacks hook "
                "(docs/plugins.md) and name it here, so every process of a run, torchrun's "
                "workers included, builds its own"
            )
        return value

    def changed(self, other: TrainConfig) -> dict[str, tuple[Any, Any]]:
        """Keys whose values differ from ``other``: ``{key: (other's, ours)}``."""
        mine, theirs = self.model_dump(), other.model_dump()
        return {k: (theirs[k], v) for k, v in mine.items() if theirs[k] != v}


_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}

CORE = "falconet-core"
"""The owner :func:`key_owners` gives the core's own keys."""


def config_model(plugins: Plugins) -> type[TrainConfig]:
    """The run's configuration class: :class:`TrainConfig` plus every key a plugin declares
    (``register_train_keys``). Made once per :class:`Plugins`; a key declared twice (by two
    plugins, or by a plugin and the core) is an error naming both."""
    made = _MODELS.get(plugins)
    if made is not None:
        return made
    fields: dict[str, Any] = {}
    owners = dict.fromkeys(TrainConfig.model_fields, CORE)
    for entry in plugins.train_keys.entries():
        owner = entry.provenance.distribution
        for key, info in entry.item.keys.model_fields.items():
            if key in owners:
                raise ConfigError(
                    f"training key {key!r} is declared by both {owners[key]} and {owner} "
                    f"(key group {entry.name!r}); uninstall one of them"
                )
            owners[key] = owner
            fields[key] = (info.annotation, info)
    model = create_model("TrainConfig", __base__=TrainConfig, **fields) if fields else TrainConfig
    _OWNERS[model] = owners
    _MODELS[plugins] = model
    return model


_MODELS: weakref.WeakKeyDictionary[Plugins, type[TrainConfig]] = weakref.WeakKeyDictionary()
_OWNERS: dict[type[TrainConfig], dict[str, str]] = {
    TrainConfig: dict.fromkeys(TrainConfig.model_fields, CORE)
}


def key_owners(model: type[TrainConfig]) -> dict[str, str]:
    """``{key: distribution that declares it}`` for ``model``'s keys."""
    return _OWNERS.get(model) or dict.fromkeys(model.model_fields, CORE)


def check_keys(
    keys: Mapping[str, Any],
    model: type[TrainConfig] = TrainConfig,
    where: str = "key",
    plugins: Plugins | None = None,
) -> None:
    """Refuse unknown keys, naming the closest known one, or the plugin that declares it (and,
    with ``plugins``, why that plugin did not load when it is installed)."""
    for key in keys:
        if key not in model.model_fields:
            provider = known_provider("train_keys", key)
            problem = plugins.why_not_loaded(provider) if plugins and provider else None
            if problem:
                raise ConfigError(f"unknown {where} {key!r}: it is a key of {provider}; {problem}")
            if provider:
                raise ConfigError(
                    f"unknown {where} {key!r}: it is a key of {provider}, which is not "
                    f"installed; pip install {provider}"
                )
            close = difflib.get_close_matches(key, tuple(model.model_fields), n=1)
            hint = (
                f"; did you mean {close[0]}=?" if close else "; `falconet train --help` lists all"
            )
            raise ConfigError(f"unknown {where} {key!r}{hint}")


def build_config(model: type[TrainConfig], *layers: Mapping[str, Any]) -> TrainConfig:
    """Merge ``layers`` (later wins) and validate them as ``model``; errors name the key and
    what is allowed."""
    merged: dict[str, Any] = {}
    for layer in layers:
        check_keys(layer, model)
        merged.update(layer)
    try:
        return model.model_validate(merged)
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


def describe_keys(model: type[TrainConfig] = TrainConfig) -> list[tuple[str, str, str, str]]:
    """``(key, default, meaning, owner)`` for every key, the core's first, in declaration
    order (for ``--help``); ``owner`` is the distribution that declares the key."""
    owners = key_owners(model)
    rows = []
    for key, field in model.model_fields.items():
        shown = format_value(field.get_default(call_default_factory=True))
        rows.append((key, shown, field.description or "", owners.get(key, CORE)))
    return rows


def format_value(value: Any) -> str:
    """A key's value as it is typed on the command line (``true``, ``a,b``, ``-`` for none)."""
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    return str(value).lower() if isinstance(value, bool) else str(value)
