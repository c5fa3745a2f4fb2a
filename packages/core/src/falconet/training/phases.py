"""The phases of a training step, as a seam for whoever wants to time them (the profiler).

A step runs each of its phases inside ``phases(name)``: ``data`` (the next batch from the
loader), ``to-device``, ``forward``, ``loss``, ``backward``, ``optimizer`` (schedule, unscale,
clip, step, zero) and ``ema``; ``optimizer`` and ``ema`` only on steps that update the weights
(every ``accumulate`` batches). A graph backend that replays the whole step (``whole-step``)
runs its replayed batches as one ``step`` phase instead of forward to ema.

:class:`Phases` is one object shared by the loop and the step (it is one of the step's parts,
:class:`falconet.contract.StepParts`). By default it hands back one shared do-nothing
context, so the seam costs a call per phase and no allocation; a profiler installs its own
timer for a window of steps (:meth:`Phases.use`) and puts the default back after
(:meth:`Phases.reset`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

PHASES = ("data", "to-device", "forward", "loss", "backward", "optimizer", "ema", "step")

PhaseTimer = Callable[[str], AbstractContextManager[Any]]
"""``timer(phase_name) -> context`` entered around the phase."""

_NOTHING = contextlib.nullcontext()


def _no_timer(name: str) -> AbstractContextManager[Any]:
    return _NOTHING


class Phases:
    """``phases(name)``: the context a phase runs in, from the installed timer."""

    def __init__(self) -> None:
        self.timer: PhaseTimer = _no_timer

    def __call__(self, name: str) -> AbstractContextManager[Any]:
        return self.timer(name)

    def use(self, timer: PhaseTimer) -> None:
        """Run every phase inside ``timer(name)`` from now on."""
        self.timer = timer

    def reset(self) -> None:
        """Back to the do-nothing default."""
        self.timer = _no_timer

    @property
    def timed(self) -> bool:
        """Whether a timer other than the default is installed."""
        return self.timer is not _no_timer
