"""The garbage collections a benchmarked span ran: each one's start, generation and duration.

A full collection (generation 2) walks every object the process tracks while holding the
interpreter: in a training process that is a pause of the training thread a benchmark should
be able to name (falconet.training.collector says when falconet runs them). Used by
``bench_train.py --measures e2e`` (the collections during ``fit``) and ``bench_startup.py``
(those from the child's start to its exit).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable


class CollectorLog:
    """Records every collection between :meth:`start` and :meth:`stop` (``gc.callbacks``)."""

    def __init__(
        self, origin: float | None = None, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.clock = clock
        self.origin = clock() if origin is None else origin  # on ``clock``'s scale
        self.collections: list[tuple[float, int, float]] = []  # (start s, generation, ms)
        self._began = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        now = self.clock()
        if phase == "start":
            self._began = now
        else:
            self.collections.append(
                (round(self._began - self.origin, 3), info["generation"], (now - self._began) * 1e3)
            )

    def start(self) -> CollectorLog:
        gc.callbacks.append(self._callback)
        return self

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def summary(self, until: float | None = None) -> dict:
        """Counts and milliseconds per generation, and every collection of 1 ms or more (its
        start in seconds from the origin, its generation, its ms); only those starting before
        ``until`` (seconds from the origin) where given."""
        kept = [c for c in self.collections if until is None or c[0] < until]
        per_generation = {
            str(g): {
                "count": sum(1 for c in kept if c[1] == g),
                "ms": round(sum(c[2] for c in kept if c[1] == g), 1),
            }
            for g in (0, 1, 2)
        }
        slow = [[s, g, round(ms, 1)] for s, g, ms in kept if ms >= 1.0]
        return {"per_generation": per_generation, "over_1_ms": slow}
