"""What every graph backend must do: build a step from the step's parts that trains as the
eager step does.

The suite trains a small BatchNorm network for a few accumulation windows twice from the same
state and batches, once with :class:`falconet.graph_backends.eager_step.EagerStep` and once with the
backend's step, and compares losses, weights, optimizer state, EMA and update counts. Set
``exact = False`` (with ``rtol``/``atol``) for a backend whose kernels round differently from
eager (``compile``). A backend that declines on ``device`` skips the training tests with its
reason. Its context holds the step's own objects (:class:`falconet.contract.GraphContext`:
the precision backend, optimizer and scaler themselves), and it is asked with each built-in
precision. ``build_step`` may be overridden to drive a backend on the CPU with a stand-in
recorder (the whole step's logic, with its recordings run eagerly on the same static buffers).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest

from falconet.contract import GraphBackend, GraphContext

BATCHES = 12
ACCUMULATE = 2


def _network() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.SiLU(),
        torch.nn.Conv2d(8, 4, 1),
    )


def _loss(outputs: Any, targets: Any) -> tuple[Any, dict[str, Any]]:
    """A static-shaped, sync-free loss of the outputs and the boxes (no assigner needed)."""
    spread = outputs.float().pow(2).mean()
    pull = (outputs.float().mean((2, 3))[:, :4] - targets.boxes.mean(1) / 16).pow(2).mean()
    return spread + pull, {"spread": spread.detach(), "pull": pull.detach()}


def sample_batches(device: Any) -> list[tuple[Any, Any]]:
    import torch

    from falconet.data.targets import Targets

    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(BATCHES):
        images = torch.rand(4, 3, 16, 16, generator=generator)
        counts = torch.tensor([1, 2, 0, 1])
        boxes = torch.rand(4, 8, 4, generator=generator) * 16
        labels = torch.randint(0, 4, (4, 8), generator=generator)
        targets = Targets.from_padded(boxes, labels, counts)
        out.append((images.to(device), targets.to(device)))
    return out


def sample_parts(device: Any) -> Any:
    import torch

    from falconet.contract import Progress, StepParts
    from falconet.precision import FP32
    from falconet.training.config import TrainConfig
    from falconet.training.optimization import ModelEMA, Schedule, build_optimizer
    from falconet.training.phases import Phases

    cfg = TrainConfig(batch=4, nbs=8, warmup_epochs=0, lr0=0.05, clip_grad=1.0)
    model = _network().to(device, memory_format=torch.channels_last).train()
    return StepParts(
        model=model,
        loss=_loss,
        optimizer=build_optimizer(model, cfg, ACCUMULATE),
        precision=FP32,
        scaler=None,
        ema=ModelEMA(model, cfg.ema_decay, cfg.ema_tau),
        clip_grad=cfg.clip_grad,
        loss_gain=float(cfg.batch),
        schedule=Schedule(cfg, BATCHES // ACCUMULATE),
        progress=Progress(),
        phases=Phases(),
        device=torch.device(device),
    )


def train_batches(step: Any, data: list) -> list[float]:
    losses = []
    for i, (images, targets) in enumerate(data):
        out = step(images, targets, update=(i + 1) % ACCUMULATE == 0)
        assert out.loss.dim() == 0, "a step's loss is a 0-dim tensor"
        assert all(hasattr(v, "detach") for v in out.parts.values()), "parts are tensors"
        losses.append(float(out.loss.detach()))
    return losses


def _state(parts: Any) -> list[Any]:
    tensors = list(parts.model.state_dict().values())
    tensors += list(parts.ema.module.state_dict().values())
    for state in parts.optimizer.state.values():
        tensors += [v for v in state.values() if hasattr(v, "dim") and v.dim() > 0]
    return tensors


class GraphBackendContract:
    """Subclass with ``backend`` (an instance registered by your plugin); set ``device``
    (default ``cpu``), ``config`` (the run's keys the backend reads: an instance of its own
    key model, say), and for a backend that is not bit for bit eager ``exact = False`` with
    ``rtol``/``atol``."""

    backend: ClassVar[GraphBackend]
    device: ClassVar[str] = "cpu"
    config: ClassVar[Any] = None
    exact: ClassVar[bool] = True
    rtol: ClassVar[float] = 1e-4
    atol: ClassVar[float] = 1e-5

    def context(self, parts: Any = None) -> GraphContext:
        import torch

        from falconet.precision import FP32

        return GraphContext(
            torch.device(self.device),
            parts.precision if parts is not None else FP32,
            capture_region=parts.model if parts is not None else None,
            static_loss=True,
            optimizer=parts.optimizer if parts is not None else None,
            scaler=parts.scaler if parts is not None else None,
            config=self.config,
        )

    def build_step(self, parts: Any, context: GraphContext) -> Any:
        """The step under test (override to drive the backend with a stand-in recorder)."""
        return self.backend.build_step(parts, context)

    def _declined(self, parts: Any) -> None:
        import torch

        if self.device == "cuda" and not torch.cuda.is_available():
            pytest.skip("needs a CUDA device; the GPU half runs on the GPU machine")
        reason = self.backend.decline_reason(self.context(parts))
        if reason is not None:
            pytest.skip(f"{self.backend.name} declines on {self.device}: {reason}")

    def test_satisfies_interface(self) -> None:
        assert isinstance(self.backend, GraphBackend)
        priority = self.backend.priority
        assert priority is None or isinstance(priority, int), "priority: an int, or None"
        assert isinstance(self.backend.replays, bool), "replays: whether its step replays"

    def test_declines_with_one_line_or_accepts(self) -> None:
        """Asked on either device, with each built-in precision backend and fp16's scaler, the
        step's optimizer, or nothing but a network (a first look), it answers in one line."""
        import torch

        from falconet.loss_scaler import LossScaler
        from falconet.precision import BF16, FP16, FP32

        parts = sample_parts("cpu")
        for device in ("cpu", "cuda"):
            bare = GraphContext(torch.device(device), FP32, capture_region=_network())
            full = dataclasses.replace(self.context(parts), device=torch.device(device))
            contexts = [
                bare,
                full,
                dataclasses.replace(full, precision=BF16),
                dataclasses.replace(full, precision=FP16, scaler=LossScaler("cpu")),
            ]
            for context in contexts:
                reason = self.backend.decline_reason(context)
                assert reason is None or (reason.strip() and "\n" not in reason), (
                    f"{self.backend.name}: a decline reason is one non-empty line, got "
                    f"{reason!r} ({context.precision.name} on {device})"
                )

    def test_trains_as_the_eager_step(self) -> None:
        import torch

        from falconet.contract import CaptureStats
        from falconet.graph_backends.eager_step import EagerStep

        eager, parts = sample_parts(self.device), sample_parts(self.device)
        self._declined(parts)
        step = self.build_step(parts, self.context(parts))
        initial = [t.clone() for t in parts.model.parameters()]
        data = sample_batches(self.device)
        reference, got = train_batches(EagerStep(eager), data), train_batches(step, data)
        assert parts.progress.updates == eager.progress.updates == BATCHES // ACCUMULATE
        assert parts.ema.updates == eager.ema.updates
        params = zip(initial, parts.model.parameters(), strict=True)
        moved = [not torch.equal(a, b) for a, b in params]
        assert all(moved), "every parameter must move: the optimizer really stepped"
        stats = step.stats()
        assert isinstance(stats, CaptureStats)
        assert stats.replayed + stats.eager in (0, BATCHES), "replayed + eager counts batches"
        assert (stats.replayed > 0) == self.backend.replays, (
            f"{self.backend.name}: replays={self.backend.replays}, and its step replayed "
            f"{stats.replayed} of {BATCHES} batches"
        )
        pairs = list(zip(_state(eager), _state(parts), strict=True))
        if self.exact:
            assert got == reference, f"{self.backend.name}: losses differ from the eager step"
            unequal = sum(not torch.equal(a, b) for a, b in pairs)
            assert unequal == 0, f"{unequal} of {len(pairs)} tensors differ from eager"
        else:
            torch.testing.assert_close(got, reference, rtol=self.rtol, atol=self.atol)
            for a, b in pairs:
                torch.testing.assert_close(a, b, rtol=self.rtol * 10, atol=self.atol * 10)

    def test_a_batch_without_update_accumulates_and_leaves_the_weights(self) -> None:
        import torch

        parts = sample_parts(self.device)
        self._declined(parts)
        step = self.build_step(parts, self.context(parts))
        before = [p.detach().clone() for p in parts.model.parameters()]
        images, targets = sample_batches(self.device)[0]
        step(images, targets, update=False)
        after = list(parts.model.parameters())
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        assert parts.progress.updates == 0
