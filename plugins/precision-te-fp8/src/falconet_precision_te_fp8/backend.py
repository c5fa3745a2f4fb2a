"""The ``fp8`` precision backend: bf16 autocast everywhere, FP8 matrix products (Transformer
Engine) in the linear layers that measured faster in FP8 at the run's shapes.

The registered :class:`Fp8Precision` only says whether FP8 can run here (cheaply: Transformer
Engine's version is read from its metadata, not imported); :meth:`Fp8Precision.configure`
makes the run's :class:`Fp8Run`, which converts the network in :meth:`Fp8Run.wrap_model`.
Master weights stay fp32 as in every falconet precision (the optimizer and the EMA see the
same parameters); each converted layer quantises its inputs and weights to FP8 in its product.
Validation and a loaded checkpoint run in bf16: the state dict is the plain network's.
"""

from __future__ import annotations

import contextlib
import logging
from importlib import metadata

import torch
from torch import nn

from falconet.contract import PrecisionContext
from falconet.precision import BF16
from falconet.training.config import ConfigError
from falconet_precision_te_fp8.eligibility import linear_layers
from falconet_precision_te_fp8.gating import TimingCache, choose, layer_rows, products
from falconet_precision_te_fp8.keys import Fp8Keys

log = logging.getLogger("falconet.train")

INSTALL = "pip install 'transformer-engine[pytorch]>=2.0' (Linux x86-64 with CUDA)"
MIN_TE = (2, 0)
MIN_CAPABILITY = (8, 9)
BLACKWELL = (10, 0)
BLACKWELL_RECIPES = {"mxfp8", "nvfp4"}
PROBE_BATCH = 16
"""The batch the probe forward runs at while autobatch has not chosen one."""


def te_version() -> str | None:
    """Transformer Engine's installed version, from its metadata (no import)."""
    for dist in ("transformer-engine", "transformer_engine"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
    return None


def recipe_error(recipe: str, capability: tuple[int, int], gpu: str) -> str | None:
    """Why ``fp8_recipe=recipe`` cannot run on a GPU of ``capability``, or ``None``."""
    if recipe in BLACKWELL_RECIPES and capability < BLACKWELL:
        return (
            f"fp8_recipe={recipe} needs a Blackwell GPU (compute capability 10.0+); {gpu} is "
            f"{capability[0]}.{capability[1]}: use fp8_recipe=current, delayed or block"
        )
    return None


class Fp8Precision:
    """``fp8``: what the registry holds (configured per run by :meth:`configure`)."""

    name = "fp8"
    summary = "FP8 products in the linear layers that measure faster (Transformer Engine)"

    def unavailable_reason(self, device: torch.device) -> str | None:
        if device.type != "cuda":
            return f"amp_dtype={self.name} needs a CUDA GPU (this run is on {device.type})"
        version = te_version()
        if version is None:
            return f"amp_dtype={self.name} needs Transformer Engine: {INSTALL}"
        if tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) < MIN_TE:
            return (
                f"amp_dtype={self.name} needs Transformer Engine 2.0 or newer (found {version}): "
                f"{INSTALL}"
            )
        capability = torch.cuda.get_device_capability(device)
        if capability < MIN_CAPABILITY:
            return (
                f"amp_dtype={self.name}: {torch.cuda.get_device_name(device)} has compute "
                f"capability {capability[0]}.{capability[1]}; FP8 needs 8.9 (Ada, Hopper) or "
                f"newer: use amp_dtype=bf16"
            )
        return None

    def configure(self, context: PrecisionContext):
        if not context.training:
            return BF16  # a trained model evaluates in bf16: its weights are plain
        keys = context.keys(Fp8Keys)
        capability = torch.cuda.get_device_capability(context.device)
        if reason := recipe_error(
            keys.fp8_recipe, capability, torch.cuda.get_device_name(context.device)
        ):
            raise ConfigError(reason)
        return Fp8Run(context, keys)

    # the registered instance is never used unconfigured; these make it a PrecisionBackend
    def autocast(self, device: torch.device):
        return BF16.autocast(device)

    def grad_scaler(self, device: torch.device):
        return None

    def wrap_model(self, model: nn.Module) -> nn.Module:
        raise RuntimeError("amp_dtype=fp8: configure() the backend for a run first")


class Fp8Run:
    """The ``fp8`` backend of one run: its recipe, and the layers it converted."""

    name = "fp8"
    summary = Fp8Precision.summary

    def __init__(self, context: PrecisionContext, keys: Fp8Keys) -> None:
        from falconet_precision_te_fp8 import te_modules

        self.te = te_modules
        self.context, self.keys = context, keys
        self.recipe = te_modules.build_recipe(keys.fp8_recipe)
        self.group = None
        if context.world_size > 1:  # amax reduced over every rank
            self.group = torch.distributed.group.WORLD
        self.converted: list[str] = []

    def unavailable_reason(self, device: torch.device) -> str | None:
        return Fp8Precision().unavailable_reason(device)

    def configure(self, context: PrecisionContext):
        return self

    def autocast(self, device: torch.device):
        """bf16 autocast, and TE's FP8 autocast around it once a layer converted; with none
        converted (gating kept every product bf16) the step is the bf16 step, TE's per-step
        state and its host time left out."""
        if not self.converted:
            return BF16.autocast(device)
        stack = contextlib.ExitStack()
        stack.enter_context(BF16.autocast(device))
        stack.enter_context(self.te.autocast(self.recipe, self.group))
        return stack

    def grad_scaler(self, device: torch.device):
        return None  # FP8 scales per tensor itself; bf16 needs no loss scaling

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Swap the chosen ``nn.Linear`` layers for :class:`te_modules.Fp8Linear` in place,
        and log once what converted and what stayed bf16, with why."""
        layers = linear_layers(model, self.keys.fp8_min_dim)
        if not layers:
            log.info("fp8: the network has no linear layer; every product runs in bf16")
            return model
        device = self.context.device
        model.to(device)
        batch = self.context.batch or PROBE_BATCH
        size = self.context.imgsz
        example = torch.zeros(batch, 3, size, size, device=device)
        eligible = [x.name for x in layers if x.skipped is None]
        was_training = model.training
        model.train()
        rows = layer_rows(model, eligible, example) if eligible else {}
        model.train(was_training)
        force = self.keys.fp8_layers == "all"
        timings = {}
        if not force:
            replayed = self.context.replays  # as the run's graph backend declares
            cache = TimingCache.for_run(
                torch.cuda.get_device_name(device),
                te_version() or "?",
                self.keys.fp8_recipe,
                replayed,
            )
            timings = cache.measure(
                products(layers, rows),
                lambda p: self.te.time_product(p, self.recipe, replayed=replayed),
            )
        decisions = choose(layers, rows, timings, force)
        modules = dict(model.named_modules())
        for name, reason in decisions.items():
            if reason is None:
                parent_name, _, attribute = name.rpartition(".")
                parent = modules[parent_name] if parent_name else model
                setattr(parent, attribute, self.te.Fp8Linear.replacing(modules[name]))
                self.converted.append(name)
        log_decisions(decisions, self.keys, batch, size)
        return model


def log_decisions(decisions: dict[str, str | None], keys: Fp8Keys, batch: int, size: int) -> None:
    """One summary line, and one line per reason a layer stayed bf16."""
    converted = [n for n, r in decisions.items() if r is None]
    how = "every eligible layer" if keys.fp8_layers == "all" else f"measured at batch {batch}"
    log.info(
        "fp8 (%s, %s, %d px): %d of %d linear layers in FP8",
        keys.fp8_recipe,
        how,
        size,
        len(converted),
        len(decisions),
    )
    kept: dict[str, list[str]] = {}
    for name, reason in decisions.items():
        if reason is not None:
            kept.setdefault(reason, []).append(name)
    for reason, names in kept.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        log.info("fp8: bf16 for %s: %s", shown, reason)
