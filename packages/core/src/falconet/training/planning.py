"""From the keys a user passes to a resolved run: its configuration, family and weights.

The configuration is layered (see :mod:`falconet.training.config`): defaults, the family's
recipe, the dataset's ``train_defaults:``, the user's keys. ``resume`` replaces all of that
with the configuration saved in ``last.pt``; only keys that cannot change the numbers
(``device``, ``workers``) may be passed beside it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from falconet.contract import Callback, ModelFamily
from falconet.data.records import DataError
from falconet.data.resolve import resolve_data_path
from falconet.data.yolo import read_yaml
from falconet.plugins import Plugins
from falconet.training.augment_presets import preset_keys
from falconet.training.checkpoint import load_checkpoint
from falconet.training.config import (
    ConfigError,
    TrainConfig,
    build_config,
    check_keys,
    config_model,
)
from falconet.training.run_dir import latest_checkpoint

RESUME_OVERRIDES = ("device", "workers", "resume")

log = logging.getLogger("falconet.train")


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


def data_defaults(data: str, model: type[TrainConfig] = TrainConfig) -> dict[str, Any]:
    """The ``train_defaults:`` mapping of a data yaml (``{}`` when it has none)."""
    config = read_yaml(resolve_data_path(data))
    hints = config.get("train_defaults") or {}
    if not isinstance(hints, dict):
        raise DataError(f"data={data}: train_defaults must be a mapping of training keys")
    check_keys(hints, model, where=f"key in {data}'s train_defaults:")
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
    check_keys(keys, config_model(plugins), plugins=plugins)
    resume = keys.get("resume")
    if resume not in (None, False) and str(resume).lower() not in ("false", "no", "0"):
        return _plan_resume(keys, plugins)
    if (restarted := elastic_restart(keys)) is not None:
        log.warning("torchrun restarted the workers: resuming from %s", restarted)
        kept = {k: keys[k] for k in ("device", "workers") if k in keys}
        return _plan_resume({**kept, "resume": str(restarted)}, plugins)
    model = keys.get("model") or base_model or default_model(plugins)
    start = base_weights
    if str(model).endswith(".pt"):
        start = load_checkpoint(model)
    model_name = start["spec"]["model"] if start else str(model)
    family = plugins.families.get(model_name)
    data = keys.get("data") or TrainConfig.model_fields["data"].default
    model_keys = config_model(plugins)
    layers = (
        dict(family.default_recipe(model_name)),
        data_defaults(str(data), model_keys),
        preset_keys(dict(keys)),  # augment=: between the recipe and the keys named
        dict(keys),
        {"model": str(model)},  # what was trained, in args.yaml and the checkpoints
    )
    config = build_config(model_keys, *layers)
    check_plugins(config, plugins)
    family = configured(family, config)
    return Plan(config, family, model_name, start["weights"] if start else None)


def configured(family: ModelFamily, config: TrainConfig) -> ModelFamily:
    """The family a run of ``config`` uses: a family with training keys of its own (registered
    through ``register_train_keys``) implements ``configure(options) -> ModelFamily``, given
    the run's resolved keys, and the run builds its network and loss with what it returns
    (optional: a family without it is used as it is); the core names none of its keys. A
    ``grad_checkpoint`` region the family does not declare is refused here."""
    from falconet.grad_checkpoint import refuse_unsupported

    options = config.model_dump()
    refuse_unsupported(family, options)
    configure = getattr(family, "configure", None)
    return family if configure is None else configure(options)


def default_model(plugins: Plugins) -> str:
    """The model a run trains when it names none: the first model of the installed family
    of highest ``priority`` (ties by family name)."""
    families = plugins.families.entries()
    if not families:
        raise ConfigError(
            "no model family is installed, so there is nothing to train: install a family "
            "plugin (the README lists them); `falconet plugins list` shows what is installed"
        )
    best = min(families, key=lambda e: (-e.item.priority, e.name))
    return best.item.models[0]


def elastic_restart(keys: Mapping[str, Any]) -> Path | None:
    """After torchrun restarted failed workers (``TORCHELASTIC_RESTART_COUNT`` above 0), the
    run's latest ``last.pt`` under ``project``, which the restarted workers resume from;
    ``None`` on a first attempt, or when the first attempt saved nothing (it starts again)."""
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) == 0:
        return None
    project = keys.get("project") or TrainConfig.model_fields["project"].default
    found = sorted(Path(str(project)).glob("*/weights/last.pt"), key=os.path.getmtime)
    return found[-1] if found else None


def check_plugins(config: TrainConfig, plugins: Plugins) -> None:
    """Fail at configuration time, with the install command, for a name nothing registered."""
    if config.amp_dtype != "auto":
        plugins.precision_backends.get(config.amp_dtype)
    if config.graph != "auto":
        plugins.graph_backends.get(config.graph)
    if config.assigner is None:
        raise ConfigError(
            f"model={config.model}: its family's recipe names no label assigner; set "
            f"assigner= one of {', '.join(plugins.assigners.names())}"
        )
    plugins.assigners.get(config.assigner)
    if config.eval_backend != "auto":
        plugins.eval_backends.get(config.eval_backend)
    for name in config.callbacks:
        plugins.callbacks.get(name)


def callback_names(config: TrainConfig, plugins: Plugins) -> list[str]:
    """The registered callbacks a run adds: every one whose ``wanted(config)`` says so (the
    core's loggers, a plugin's callback behind its own key), in name order, then those
    ``callbacks`` names."""
    names = [e.name for e in plugins.callbacks.entries() if e.item.wanted(config)]
    return names + [n for n in config.callbacks if n not in names]


def build_callbacks(config: TrainConfig, plugins: Plugins) -> list[Callback]:
    """One instance of each of :func:`callback_names`."""
    return [plugins.callbacks.get(name)() for name in callback_names(config, plugins)]


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
    config = build_config(config_model(plugins), saved)
    model_name = state["spec"]["model"]
    family = configured(plugins.families.get(model_name), config)
    return Plan(config, family, model_name, None, state, path)
