"""The training step as an interface: the parts a step is made of, and the step itself.

The loop assembles :class:`StepParts` (network, loss with its assigner, optimizer, precision
with its scaler, EMA, clipping, schedule, phases) once per run and hands them to the run's
graph backend, which returns a :class:`TrainStep`: one call signature,
``step(images, targets, update=...) -> StepOutput``, and typed capture statistics
(:class:`CaptureStats`). :class:`falconet.graph_backends.eager_step.EagerStep` is the reference
implementation, op by op; a backend that dispatches only the network (``compile``,
``cuda-graph``) gives it its network callable, and one that replays the whole step
(``whole-step``) keeps an eager step of its own for the batches it has not recorded.

Every step leaves the model, the optimizer's state, the scaler and the EMA as the eager step
would (up to the rounding a backend documents), and counts its optimizer updates in
:class:`Progress`, so checkpoints and resume do not depend on the backend.

Gradients accumulate over the loop's ``accumulate`` batches; the loss, a per-image mean, is
multiplied by ``loss_gain`` (the batch size) before backward, so an update's gradient sums over
the nominal batch as the YOLO recipes' ``lr0`` assumes.

Types only: torch and the trainer's modules are imported for type checking alone, so a plugin
importing this module imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn

    from falconet.contract.kinds import PrecisionBackend
    from falconet.data.targets import Targets
    from falconet.loss_scaler import LossScaler
    from falconet.training.collectives import RankCollectives
    from falconet.training.optimization import ModelEMA, Schedule
    from falconet.training.phases import Phases

LossFn = Callable[[Any, "Targets"], "tuple[torch.Tensor, dict[str, torch.Tensor]]"]
"""``loss(outputs, targets) -> (total [], parts {name: []})``, the family's loss with its
assigner (:meth:`falconet.contract.ModelFamily.build_loss`)."""


@dataclass
class Progress:
    """Where the run is: the epoch being trained (0-based) and the optimizer updates so far.

    The schedule is a function of these two numbers, so they are all a resume needs of it. The
    loop advances ``epoch``; the step advances ``updates`` when it updates the weights."""

    epoch: int = 0
    updates: int = 0


@dataclass(frozen=True)
class StepParts:
    """What one training step is made of; a graph backend receives these and nothing else.

    :param model: the trained network (train mode, on ``device``); its parameters are what the
        optimizer steps.
    :param loss: the family's loss with its assigner (:data:`LossFn`), computed in the
        precision's autocast.
    :param optimizer: SGD or AdamW over the model's parameter groups; the schedule sets each
        group's ``lr`` and momentum before an update.
    :param precision: the precision backend (its ``autocast(device)`` wraps the forward).
    :param scaler: fp16's loss scaler, or ``None``.
    :param ema: the EMA of the weights, or ``None``.
    :param clip_grad: the largest gradient norm (0: no clipping).
    :param loss_gain: what the loss is multiplied by before backward (the batch size).
    :param schedule: learning rate and momentum per update (:class:`Schedule`).
    :param progress: the run's epoch and update count, shared with the loop.
    :param phases: the phase timer shared with the loop (:mod:`falconet.training.phases`).
    :param device: the training device.
    :param replicate: in a distributed run, what wraps the network the step calls in
        ``DistributedDataParallel`` (:func:`falconet.training.distributed.replicate`), whose
        backward averages the gradients over the ranks; ``None`` otherwise.
    :param collectives: in a distributed run, what the step needs of the other ranks
        (:class:`falconet.training.collectives.RankCollectives`): a backend that takes over
        the whole step averages the gradients itself; every step gives each rank rank 0's
        buffers after an update. ``None`` otherwise.
    """

    model: nn.Module
    loss: LossFn
    optimizer: torch.optim.Optimizer
    precision: PrecisionBackend
    scaler: LossScaler | None
    ema: ModelEMA | None
    clip_grad: float
    loss_gain: float
    schedule: Schedule
    progress: Progress
    phases: Phases
    device: torch.device
    replicate: Callable[[nn.Module], nn.Module] | None = None
    collectives: RankCollectives | None = None

    def set_rates(self) -> None:
        """Set the optimizer's learning rates and momenta for the next update."""
        self.schedule.apply(self.optimizer, self.progress.updates, self.progress.epoch)


class StepOutput(NamedTuple):
    """A step's loss (``[]``, the per-image mean before ``loss_gain``) and its named parts,
    device tensors: reading them is the caller's host synchronisation, not the step's."""

    loss: torch.Tensor
    parts: dict[str, torch.Tensor]


@dataclass(frozen=True)
class CaptureStats:
    """What a step's graph backend has recorded so far (all zero for one that records nothing).

    ``recorded`` and ``failed`` count captures; ``replayed`` and ``eager`` count batches;
    ``pending`` is true while the backend will record but has not yet (its batches run eagerly
    meanwhile, so a profiler waits it out); ``capture_seconds`` is the host time of every
    recording, warm-up included."""

    recorded: int = 0
    failed: int = 0
    replayed: int = 0
    eager: int = 0
    pending: bool = False
    capture_seconds: float = 0.0

    @classmethod
    def from_counts(cls, counts: dict[str, int], **more: Any) -> CaptureStats:
        """From a recorder's ``counts`` (``recorded``, ``failed``, ``replayed``, ``eager``;
        other entries ignored) and ``more`` fields."""
        keys = ("recorded", "failed", "replayed", "eager")
        return cls(**{k: counts[k] for k in keys}, **more)

    @property
    def captures(self) -> int:
        """Captures tried so far, successful or not."""
        return self.recorded + self.failed


NO_CAPTURES = CaptureStats()
"""The statistics of a step that records nothing."""


@runtime_checkable
class TrainStep(Protocol):
    """One training batch: forward, loss and backward, and with ``update`` the optimizer step
    (schedule, unscale, clip, step, zero) and the EMA update."""

    def __call__(self, images: torch.Tensor, targets: Targets, *, update: bool) -> StepOutput:
        """Train on ``images [B, 3, H, W]`` (float in ``[0, 1]``) and ``targets``."""
        ...

    def stats(self) -> CaptureStats:
        """What the step has captured so far."""
        ...
