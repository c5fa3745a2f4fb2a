"""What callbacks see of a run: a typed view, not the trainer.

:class:`RunState` holds the run's fixed facts (where it writes, what it trains, how the step
runs) and its progress (epoch, batch, updates, the last logged scalars and evaluation), which
the loop keeps current on the host. A callback may also install a phase timer
(:attr:`RunState.phases`), ask for the step's capture statistics (:meth:`RunState.step_stats`)
and end the run after the current batch (:meth:`RunState.request_stop`). Nothing here reads a
device value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from falconet.contract import CaptureStats, Progress
    from falconet.evaluation.contract import EvalResult
    from falconet.levers import Lever
    from falconet.training.config import TrainConfig
    from falconet.training.phases import Phases


@dataclass(frozen=True)
class Installed:
    """What is installed, for advice that names keys to change: the backends' names, the
    installed plugins' levers (:mod:`falconet.levers`) and the distributions that loaded."""

    graph_backends: frozenset[str] = frozenset()
    precision_backends: frozenset[str] = frozenset()
    levers: tuple[Lever, ...] = ()
    distributions: frozenset[str] = frozenset()


@dataclass
class RunState:
    """A training run as callbacks see it (module docstring).

    :param run_dir: the run folder (``results.csv``, ``weights/``, ...).
    :param config: the run's resolved keys, plugins' keys included.
    :param model: the model name (``yolo-n``).
    :param device: the training device.
    :param precision: the precision backend's name.
    :param graph: the graph backend's name (after ``auto`` and any fallback).
    :param accumulate: batches per optimizer update.
    :param batches_per_epoch: training batches in an epoch.
    :param train_images: images in the training split (after ``fraction``).
    :param progress: epoch and optimizer updates (shared with the step).
    :param phases: the phase timer the step runs under (a profiler installs its own).
    :param installed: the installed backends' names.
    :param world_size: the processes that train the run (1 unless distributed).
    :param rank: this process's rank among them (callbacks run on rank 0 only).
    """

    run_dir: Path
    config: TrainConfig
    model: str
    device: torch.device
    precision: str
    graph: str
    accumulate: int
    batches_per_epoch: int
    train_images: int
    progress: Progress
    phases: Phases
    installed: Installed = Installed()
    world_size: int = 1
    rank: int = 0
    batch_in_epoch: int = 0
    logged: dict[str, Any] = field(default_factory=dict)
    last_eval: EvalResult | None = None
    _stats: Callable[[], CaptureStats] | None = field(default=None, repr=False)
    _stop: Callable[[str], None] | None = field(default=None, repr=False)

    @property
    def epoch(self) -> int:
        """The epoch being trained (0-based); after an epoch's end, the epochs done."""
        return self.progress.epoch

    def step_stats(self) -> CaptureStats:
        """What the step's graph backend has captured so far."""
        from falconet.contract import NO_CAPTURES

        return self._stats() if self._stats is not None else NO_CAPTURES

    def request_stop(self, reason: str) -> None:
        """End the run after the current batch (from ``on_step_end``).

        Inside an epoch, the partial epoch is neither validated nor saved, so no checkpoint
        claims an epoch that did not finish; after an epoch's last batch the epoch ends as
        usual. ``reason`` is logged and returned in the summary as ``stop_reason``."""
        if self._stop is not None:
            self._stop(reason)
