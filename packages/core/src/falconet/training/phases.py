"""The phases of a training step, as a seam for whoever wants to time them (the profiler).

The trainer runs each phase of a step inside ``trainer.phases(name)``: ``data`` (the next batch
from the loader), ``to-device``, ``forward``, ``loss``, ``backward``, ``optimizer`` (schedule,
unscale, clip, step, zero) and ``ema``; ``optimizer`` and ``ema`` only on steps that update the
weights (every ``accumulate`` batches). When a graph backend replays the whole step
(``graph=whole-step``), its batches run as one ``step`` phase instead of forward to ema. By
default ``trainer.phases`` is :data:`NO_PHASES`,
which hands back one shared do-nothing context, so the seam costs a call per phase and no
allocation. A profiler swaps in its own callable for a window of steps (from a callback) and
restores the default after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

PHASES = ("data", "to-device", "forward", "loss", "backward", "optimizer", "ema", "step")

_NOTHING = contextlib.nullcontext()


def _no_phases(name: str) -> AbstractContextManager[Any]:
    return _NOTHING


NO_PHASES: Callable[[str], AbstractContextManager[Any]] = _no_phases
"""The default ``trainer.phases``: every phase runs inside the same do-nothing context."""
