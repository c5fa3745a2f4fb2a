"""From the keys a user passes to a resolved configuration and the run's data loaders.

The configuration is layered (see :mod:`falconet.training.config`): defaults, the family's
recipe, the dataset's ``train_defaults:``, the user's keys. ``resume`` replaces all of that
with the configuration saved in ``last.pt``; only keys that cannot change the numbers
(``device``, ``workers``) may be passed beside it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from falconet.data.loader import DetectionDataset, build_loader
from falconet.data.records import DataError, Dataset
from falconet.data.resolve import resolve_data_path
from falconet.data.transforms import AugmentConfig
from falconet.data.yolo import read_yaml
from falconet.interfaces import ModelFamily
from falconet.plugins import Plugins
from falconet.training.checkpoint import load_checkpoint
from falconet.training.components import latest_checkpoint
from falconet.training.config import ConfigError, TrainConfig, build_config, check_keys

RESUME_OVERRIDES = ("device", "workers", "resume")
PROFILER_CALLBACK = "profiler"
"""The callback ``profile=true`` adds (registered by falconet-profiler)."""


@dataclass(frozen=True)
class ModelSpec:
    """What a checkpoint needs to rebuild its network: family, model name and classes."""

    family: str
    model: str
    names: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "model": self.model, "names": list(self.names)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        return cls(data["family"], data["model"], tuple(data["names"]))


@dataclass
class Plan:
    """A resolved run: the configuration, and where its starting weights come from."""

    config: TrainConfig
    family: ModelFamily
    model_name: str
    start_weights: dict[str, torch.Tensor] | None = None
    resume_state: dict[str, Any] | None = None
    resume_path: Path | None = None


def data_defaults(data: str) -> dict[str, Any]:
    """The ``train_defaults:`` mapping of a data yaml (``{}`` when it has none)."""
    config = read_yaml(resolve_data_path(data))
    hints = config.get("train_defaults") or {}
    if not isinstance(hints, dict):
        raise DataError(f"data={data}: train_defaults must be a mapping of training keys")
    check_keys(hints, where=f"key in {data}'s train_defaults:")
    return hints


def plan_run(
    keys: Mapping[str, Any],
    plugins: Plugins,
    base_model: str | None = None,
    base_weights: dict[str, Any] | None = None,
) -> Plan:
    """Resolve ``keys`` into a :class:`Plan`.

    :param base_model: the model a :class:`~falconet.Detector` was built with (a name or a
        checkpoint), used when ``keys`` has no ``model``.
    :param base_weights: that checkpoint's content, when it was one.
    """
    check_keys(keys)
    resume = keys.get("resume")
    if resume not in (None, False) and str(resume).lower() not in ("false", "no", "0"):
        return _plan_resume(keys, plugins)
    model = keys.get("model") or base_model or TrainConfig.model_fields["model"].default
    start = base_weights
    if str(model).endswith(".pt"):
        start = load_checkpoint(model)
    model_name = start["spec"]["model"] if start else str(model)
    family = plugins.families.get(model_name)
    data = keys.get("data") or TrainConfig.model_fields["data"].default
    layers = (dict(family.default_recipe(model_name)), data_defaults(str(data)), dict(keys))
    config = build_config(*layers)
    check_plugins(config, plugins)
    return Plan(config, family, model_name, start["weights"] if start else None)


def check_plugins(config: TrainConfig, plugins: Plugins) -> None:
    """Fail at configuration time, with the install command, for a name nothing registered."""
    if config.amp_dtype != "auto":
        plugins.precision_backends.get(config.amp_dtype)
    if config.graph != "auto":
        plugins.graph_backends.get(config.graph)
    plugins.assigners.get(config.assigner)
    if config.eval_backend != "auto":
        plugins.eval_backends.get(config.eval_backend)
    for name in config.callbacks:
        plugins.callbacks.get(name)
    if config.profile:
        plugins.callbacks.get(PROFILER_CALLBACK, selector="profile=true")


def callback_names(config: TrainConfig) -> list[str]:
    """The registered callbacks a run adds: ``callbacks``, and ``profiler`` when ``profile``."""
    names = list(config.callbacks)
    if config.profile and PROFILER_CALLBACK not in names:
        names.append(PROFILER_CALLBACK)
    return names


def _plan_resume(keys: Mapping[str, Any], plugins: Plugins) -> Plan:
    extra = sorted(set(keys) - set(RESUME_OVERRIDES))
    if extra:
        raise ConfigError(
            f"resume continues the saved run with its saved keys; remove {', '.join(extra)} "
            "(only device= and workers= may change), or start a new run without resume"
        )
    resume = keys["resume"]
    truthy = resume is True or str(resume).lower() in ("true", "yes", "1")
    project = TrainConfig.model_fields["project"].default
    path = latest_checkpoint(project) if truthy else Path(str(resume))
    state = load_checkpoint(path)
    if "optimizer" not in state:
        raise ConfigError(
            f"resume={path}: this checkpoint holds weights only (a best.pt); resume from "
            "the run's weights/last.pt, or start a new run with model=" + str(path)
        )
    saved = dict(state["config"])
    saved.update({k: keys[k] for k in ("device", "workers") if k in keys})
    saved["resume"] = str(path)
    config = build_config(saved)
    model_name = state["spec"]["model"]
    return Plan(config, plugins.families.get(model_name), model_name, None, state, path)


def augment_config(cfg: TrainConfig) -> AugmentConfig:
    return AugmentConfig(
        mosaic=cfg.mosaic,
        degrees=cfg.degrees,
        translate=cfg.translate,
        scale=cfg.scale,
        hsv_h=cfg.hsv_h,
        hsv_s=cfg.hsv_s,
        hsv_v=cfg.hsv_v,
        fliplr=cfg.fliplr,
    )


def worker_count(requested: int) -> int:
    return min(requested, os.cpu_count() or 1)


def build_loaders(
    cfg: TrainConfig, dataset: Dataset, device: torch.device
) -> tuple[torch.utils.data.DataLoader, torch.utils.data.DataLoader | None]:
    """The training loader (augmented, resumable sampler) and the validation loader."""
    train = dataset.splits["train"].samples
    if cfg.fraction < 1:
        train = train[: max(1, round(len(train) * cfg.fraction))]
    workers = worker_count(cfg.workers)
    pin = device.type == "cuda"
    close_from = cfg.epochs - cfg.close_mosaic if cfg.close_mosaic else None
    train_set = DetectionDataset(
        train,
        cfg.imgsz,
        augment=augment_config(cfg),
        cache=cfg.cache,
        seed=cfg.seed,
        close_mosaic_from=close_from,
    )
    train_loader = build_loader(
        train_set, cfg.batch, workers=workers, shuffle=True, seed=cfg.seed, pin_memory=pin
    )
    val_loader = build_val_loader(cfg, dataset, device) if cfg.val else None
    return train_loader, val_loader


def build_val_loader(
    cfg: TrainConfig, dataset: Dataset, device: torch.device
) -> torch.utils.data.DataLoader:
    """Letterboxed val images in order, twice the training batch per step."""
    val_set = DetectionDataset(dataset.splits["val"].samples, cfg.imgsz, cache=cfg.cache)
    return build_loader(
        val_set,
        cfg.batch * 2,
        workers=worker_count(cfg.workers),
        shuffle=False,
        pin_memory=device.type == "cuda",
    )
