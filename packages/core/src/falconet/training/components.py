"""Choosing what a run is made of: device, precision backend, graph backend, run folder.

Each choice reads the registries, so a plugin's backend is chosen exactly as a built-in one. A
graph backend that cannot apply here declines with one log line and the run goes on eager; a
precision backend asked for by name that cannot run here is an error (falling back would
silently change the numbers), while ``amp_dtype=auto`` picks what the device supports.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from falconet.interfaces import DispatchContext, PrecisionBackend
from falconet.plugins import Plugins
from falconet.training.config import ConfigError

log = logging.getLogger("falconet.train")


def resolve_device(spec: str) -> torch.device:
    """``auto`` (first GPU, else CPU), ``cpu``, ``0`` or ``cuda:0``."""
    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    index = spec.removeprefix("cuda:") if spec.startswith("cuda:") else spec
    if not index.isdigit():
        raise ConfigError(f"device={spec!r}: expected auto, cpu, a GPU index (0) or cuda:0")
    if not torch.cuda.is_available():
        raise ConfigError(f"device={spec}: no CUDA device is visible here; use device=cpu")
    if int(index) >= torch.cuda.device_count():
        raise ConfigError(
            f"device={spec}: only {torch.cuda.device_count()} CUDA device(s) are visible"
        )
    return torch.device(f"cuda:{index}")


def choose_precision(name: str, device: torch.device, plugins: Plugins) -> PrecisionBackend:
    """The precision backend for ``amp_dtype=name`` (``auto``: bf16 on a GPU that has it,
    else fp16 on a GPU, else fp32 on the CPU, where autocast is slower than fp32)."""
    if name == "auto":
        if device.type == "cuda":
            name = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:
            name = "fp32"
    backend = plugins.precision_backends.get(name)
    if reason := backend.unavailable_reason(device):
        raise ConfigError(reason)
    return backend


# graph=auto tries these in order and takes the first that applies to the run: whole-step
# (with SGD) and cuda-graph replay an eager step bit for bit in fp32, fp16 and bf16
# (docs/performance.md, "Numerics"; whole-step's AdamW update agrees to rounding), so the
# choice changes the speed, not the numbers; compile is not among them (a compilation at the
# start, and Inductor's kernels round differently)
AUTO_GRAPHS = ("whole-step", "cuda-graph", "eager")


def choose_dispatch(
    name: str, context: DispatchContext, model: torch.nn.Module, plugins: Plugins
) -> tuple[str, Callable[..., Any]]:
    """``(name actually used, network callable)``; a declining backend falls back to eager,
    and ``graph=auto`` takes the first of :data:`AUTO_GRAPHS` that is installed and applies.

    The trainer calls the returned callable in place of ``model``, so the family's capture
    region must be the whole model or nothing (a region inside the model, as DETR-style
    families will declare, needs the wrapper installed in place; not built yet).
    """
    if name == "auto":
        declined = []
        for candidate in AUTO_GRAPHS:
            if candidate not in plugins.graph_backends.names():
                declined.append(f"{candidate}: not installed")
            elif reason := _decline_reason(candidate, context, model, plugins):
                declined.append(f"{candidate}: {reason}")
            else:
                log.info("graph=auto: %s%s", candidate, "".join(f"; {d}" for d in declined))
                return candidate, plugins.graph_backends.get(candidate).wrap(model, context)
        raise AssertionError("the eager backend declined")  # it never does
    if reason := _decline_reason(name, context, model, plugins):
        if name != "eager":
            log.warning("graph=%s declined: %s; the run continues with graph=eager", name, reason)
        return "eager", plugins.graph_backends.get("eager").wrap(model, context)
    return name, plugins.graph_backends.get(name).wrap(model, context)


def _decline_reason(
    name: str, context: DispatchContext, model: torch.nn.Module, plugins: Plugins
) -> str | None:
    """Why the backend ``name`` will not run this model, or ``None``."""
    reason = plugins.graph_backends.get(name).decline_reason(context)
    if reason is None and context.capture_region not in (None, model):
        reason = "a capture region smaller than the whole model is not supported yet"
    return reason


def new_run_dir(project: str, name: str, exist_ok: bool = False, *, weights: bool = True) -> Path:
    """``project/name``, or ``name2``, ``name3``, ... when taken (unless ``exist_ok``), made
    with a ``weights/`` folder inside when ``weights``."""
    base = Path(project)
    candidate, n = base / name, 2
    while candidate.exists() and not exist_ok:
        candidate, n = base / f"{name}{n}", n + 1
    (candidate / "weights" if weights else candidate).mkdir(parents=True, exist_ok=True)
    return candidate


def latest_checkpoint(project: str) -> Path:
    """The most recently written ``last.pt`` under ``project`` (for ``resume=true``)."""
    found = sorted(Path(project).glob("*/weights/last.pt"), key=os.path.getmtime)
    if not found:
        raise ConfigError(
            f"resume=true: no {project}/*/weights/last.pt to resume; pass resume=PATH/last.pt"
        )
    return found[-1]


def configure_determinism(seed: int, deterministic: bool, device: torch.device) -> None:
    """Seed every RNG; with ``deterministic`` ask torch for reproducible kernels."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = not deterministic
        torch.backends.cudnn.deterministic = deterministic
        if deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
