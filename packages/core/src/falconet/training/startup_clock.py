"""Where a run's start-up goes: one log line of its parts' seconds, before the first batch.

At COCO's scale the first batch came ~25 s after the process started (docs/data.md), and the
time was spread over the data's index, the store, the GPU's first use and the step's choice:
no single part shows in a profile of the loop. :func:`assemble` marks the end of each part
on a :class:`StartupClock`, and the line it logs names them in order, with the process's
age, so a slow start says which part to look at without a profiler.
"""

from __future__ import annotations

import os
import time


def process_age() -> float | None:
    """Seconds since this process started, from Linux's ``/proc`` (``None`` elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            return float(f.read().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return None


class StartupClock:
    """The seconds of each named part of the start-up, in the order they ended."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, float]] = []
        self._last = time.perf_counter()

    def mark(self, part: str) -> None:
        """``part`` ended now: it took the time since the previous mark (or the clock's
        creation). A part marked twice adds up."""
        now = time.perf_counter()
        for i, (name, seconds) in enumerate(self.parts):
            if name == part:
                self.parts[i] = (name, seconds + now - self._last)
                break
        else:
            self.parts.append((part, now - self._last))
        self._last = now

    def summary(self, age: float | None = None) -> str:
        """``"start-up 4.12 s: data 1.20 s, network 0.31 s, ... (process age 6.80 s)"``:
        the parts and their sum, then the process's age (``age``, default
        :func:`process_age`) when it is known, which adds the imports before the clock."""
        total = sum(seconds for _, seconds in self.parts)
        parts = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.parts)
        age = process_age() if age is None else age
        tail = f" (process age {age:.2f} s)" if age is not None else ""
        return f"start-up {total:.2f} s: {parts}{tail}"
