"""The training device and the seeding of every random generator."""

from __future__ import annotations

import os

import torch

from falconet.training.config import ConfigError


def resolve_device(spec: str) -> torch.device:
    """``auto`` (first GPU, else CPU), ``cpu``, ``0``, ``cuda:0`` or ``cuda`` (torch's name for
    the current GPU, the first here)."""
    spec = spec.strip().lower()
    if spec == "cuda":
        spec = "cuda:0"
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    index = spec.removeprefix("cuda:") if spec.startswith("cuda:") else spec
    if not index.isdigit():
        raise ConfigError(f"device={spec!r}: expected auto, cpu, cuda, a GPU index (0) or cuda:0")
    if not torch.cuda.is_available():
        raise ConfigError(f"device={spec}: no CUDA device is visible here; use device=cpu")
    if int(index) >= torch.cuda.device_count():
        raise ConfigError(
            f"device={spec}: only {torch.cuda.device_count()} CUDA device(s) are visible"
        )
    return torch.device(f"cuda:{index}")


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
