"""fp16's loss scaler, with the device-side handles a captured step needs.

:class:`LossScaler` is :class:`torch.amp.GradScaler` (the eager step uses it exactly as torch
documents) plus the few operations a graph backend needs to do the scaler's work inside a
recorded step, where nothing may be read back to the host: the scale and growth tracker as
device tensors, the unscale-and-check kernel on a list of gradients, and the scale update from
an overflow flag. These are the kernels ``GradScaler.unscale_`` and ``GradScaler.update`` call,
so the numbers are the same either way. Only this module touches ``GradScaler``'s private
fields; if torch renames them, this is the one place to change.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class LossScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` with public device-side handles (module docstring)."""

    def device_scale(self, device: torch.device) -> torch.Tensor:
        """The scale as a ``[1] float32`` device tensor, made on first use."""
        if self._scale is None:
            self._lazy_init_scale_growth_tracker(device)
        return self._scale

    def device_state(self, device: torch.device) -> list[torch.Tensor]:
        """The device tensors a scale update writes (the scale and the growth tracker), for a
        recorder to save and restore around its warm-up."""
        self.device_scale(device)
        return [self._scale, self._growth_tracker]

    def unscale_grads_(self, grads: Sequence[torch.Tensor], found_inf: torch.Tensor) -> None:
        """Multiply ``grads`` by ``1 / scale`` in place and set ``found_inf`` (``[] float32``,
        zeroed here) to 1 where one is not finite: ``GradScaler.unscale_``'s kernel and
        reciprocal, with no host read."""
        found_inf.zero_()
        inv_scale = self.device_scale(found_inf.device).double().reciprocal().float()
        torch._amp_foreach_non_finite_check_and_unscale_(list(grads), found_inf, inv_scale)

    def update_from_(self, found_inf: torch.Tensor) -> None:
        """``GradScaler.update`` from an overflow flag on the device: back off after an
        overflow, grow after ``growth_interval`` steps without one."""
        torch._amp_update_scale_(
            self.device_scale(found_inf.device),
            self._growth_tracker,
            found_inf,
            self.get_growth_factor(),
            self.get_backoff_factor(),
            self.get_growth_interval(),
        )
