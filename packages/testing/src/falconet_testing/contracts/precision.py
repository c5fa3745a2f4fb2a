"""What every precision backend must do (run on the CPU; the CUDA half skips without a GPU)."""

from __future__ import annotations

from typing import ClassVar

import pytest

from falconet.contract import PrecisionBackend, PrecisionContext


def _network(device):
    import torch

    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.SiLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 16 * 16, 4),
    ).to(device)


def _train_step(backend: PrecisionBackend, device_name: str) -> None:
    import torch

    device = torch.device(device_name)
    torch.manual_seed(0)
    backend = backend.configure(PrecisionContext(device, batch=2, imgsz=16))
    assert isinstance(backend, PrecisionBackend), "configure must return a PrecisionBackend"
    plain = _network(device)
    expected = {k: v.shape for k, v in plain.state_dict().items()}
    model = backend.wrap_model(plain)
    found = {k: v.shape for k, v in model.state_dict().items()}
    assert found == expected, (
        f"{backend.name}: wrap_model changed the state dict's keys or shapes (checkpoints "
        f"must load into the plain network): {sorted(set(found) ^ set(expected))}"
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = backend.grad_scaler(device)
    from falconet.loss_scaler import LossScaler

    assert scaler is None or isinstance(scaler, LossScaler), (
        f"{backend.name}: grad_scaler must return a falconet.loss_scaler.LossScaler or None "
        f"(a graph backend drives it on the device), got {type(scaler).__name__}"
    )
    images = torch.rand(2, 3, 16, 16, device=device)
    with backend.autocast(device):
        loss = model(images).float().pow(2).mean()
    assert torch.isfinite(loss), f"{backend.name}: loss is not finite"
    (scaler.scale(loss) if scaler else loss).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{backend.name}: no gradient for {name}"
        assert param.grad.dtype == param.dtype, f"{backend.name}: {name} grad dtype differs"
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


class PrecisionBackendContract:
    """Subclass with ``backend`` (an instance registered by your plugin)."""

    backend: ClassVar[PrecisionBackend]

    def test_satisfies_interface(self) -> None:
        assert isinstance(self.backend, PrecisionBackend)

    @pytest.mark.parametrize("device_name", ["cpu", "cuda"])
    def test_trains_or_says_why_not(self, device_name: str) -> None:
        import torch

        if device_name == "cuda" and not torch.cuda.is_available():
            pytest.skip("needs a CUDA device; the GPU half runs on the GPU machine")
        reason = self.backend.unavailable_reason(torch.device(device_name))
        if reason is not None:
            assert self.backend.name in reason, "the reason must name the key value to change"
            return
        _train_step(self.backend, device_name)
