"""The built-in precision backends: ``fp32``, ``fp16`` (with loss scaling) and ``bf16``.

Each is an autocast context plus, for fp16, a loss scaler
(:class:`falconet.loss_scaler.LossScaler`); the model itself stays in fp32 (master weights),
so none of them wraps the model. Torch is imported inside the methods, so
registering these costs nothing at plugin load.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from falconet.contract import PrecisionBackend, PrecisionContext
    from falconet.loss_scaler import LossScaler


def autocast_dtype(precision: PrecisionBackend, device: torch.device) -> torch.dtype | None:
    """The dtype ``precision``'s autocast computes in on ``device`` (``None``: it does not
    autocast there): what a graph backend asks of the precision it is handed, whatever
    backend that is."""
    import torch

    with precision.autocast(device):
        if not torch.is_autocast_enabled(device.type):
            return None
        return torch.get_autocast_dtype(device.type)


@dataclass(frozen=True)
class AutocastPrecision:
    """Mixed precision through :func:`torch.autocast` (or plain fp32 when ``dtype`` is None).

    :param dtype: ``"float16"``, ``"bfloat16"`` or ``None`` for full fp32.
    :param scaled: whether the loss needs a :class:`torch.amp.GradScaler` (fp16 on CUDA).
    """

    name: str
    summary: str
    dtype: str | None = None
    scaled: bool = False

    def unavailable_reason(self, device: torch.device) -> str | None:
        import torch

        if self.dtype == "float16" and device.type != "cuda":
            return (
                f"amp_dtype={self.name} needs a CUDA device (this run is on {device.type}); "
                f"use amp_dtype=bf16 or amp_dtype=fp32"
            )
        if (
            self.dtype == "bfloat16"
            and device.type == "cuda"
            and not torch.cuda.is_bf16_supported()
        ):
            return (
                f"amp_dtype={self.name}: {torch.cuda.get_device_name(device)} has no bf16 "
                f"support; use amp_dtype=fp16"
            )
        return None

    def configure(self, context: PrecisionContext) -> AutocastPrecision:
        return self  # nothing to choose per run

    def autocast(self, device: torch.device) -> AbstractContextManager[Any]:
        import torch

        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=getattr(torch, self.dtype))

    def grad_scaler(self, device: torch.device) -> LossScaler | None:
        from falconet.loss_scaler import LossScaler

        return LossScaler(device.type) if self.scaled else None

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model


FP32 = AutocastPrecision("fp32", "full fp32, no autocast")
FP16 = AutocastPrecision("fp16", "fp16 autocast with a gradient scaler (CUDA)", "float16", True)
BF16 = AutocastPrecision("bf16", "bf16 autocast, no scaler needed", "bfloat16")
