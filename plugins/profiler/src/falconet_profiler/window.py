"""The measurement window and the clock that times the phases of its batches.

A window is counted in batches (the trainer's ``on_step_end`` unit): ``warmup`` batches run and
are discarded, then ``steps`` are measured. The first half (``steps - steps // 2`` batches)
runs unsynchronised: its wall times are the run's real ones, and the ``data`` phase is the wait
for the next batch. The second half (``steps // 2``) synchronises the device before and after
every phase, so each phase's time is its own. A batch lasts from entering its ``data`` phase to
its ``on_step_end``; what lies outside the phases (the trainer's on-device bookkeeping, its
periodic log read, the callbacks) is reported as ``other``.

With gradient accumulation only every ``accumulate``-th batch (and an epoch's last) runs the
optimizer and EMA phases. Per-batch figures are measured directly; a per-optimizer-step figure
is the cost of one accumulation cycle, ``(accumulate - 1)`` plain batches plus one updating
batch (:func:`per_update_ms`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from falconet.training.phases import PHASES

Part = Literal["warmup", "unsynced", "synced", "after"]

PHASES_SEEN = (*PHASES, "other")
"""The trainer's phases and ``other`` (a batch's time outside them)."""


@dataclass(frozen=True)
class Window:
    """Which batches (0-based, counted from the start of the run) are discarded and measured."""

    warmup: int
    steps: int

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.steps < 2:
            raise ValueError("a window needs warmup >= 0 and at least 2 measured batches")

    @property
    def unsynced(self) -> int:
        """Batches in the first, unsynchronised half (the larger one when ``steps`` is odd)."""
        return self.steps - self.steps // 2

    @property
    def synced(self) -> int:
        return self.steps // 2

    @property
    def end(self) -> int:
        """The first batch after the window."""
        return self.warmup + self.steps

    def part(self, batch: int) -> Part:
        if batch < self.warmup:
            return "warmup"
        if batch < self.warmup + self.unsynced:
            return "unsynced"
        return "synced" if batch < self.end else "after"


@dataclass
class BatchRecord:
    """One measured batch: host times in nanoseconds of ``time.perf_counter_ns``."""

    index: int
    part: Part
    epoch: int = 0
    batch_in_epoch: int = 0
    images: int = 0
    start: int = 0
    end: int = 0
    phases: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def ms(self) -> float:
        return (self.end - self.start) / 1e6

    @property
    def update(self) -> bool:
        """Whether this batch ran the optimizer step."""
        return any(name == "optimizer" for name, _, _ in self.phases)

    def phase_ms(self) -> dict[str, float]:
        """Milliseconds per phase (summed if a phase ran twice), and ``other``."""
        out: dict[str, float] = {}
        for name, start, end in self.phases:
            out[name] = out.get(name, 0.0) + (end - start) / 1e6
        out["other"] = max(self.ms - sum(out.values()), 0.0)
        return out

    def to_json(self, origin: int) -> dict[str, Any]:
        return {
            "index": self.index,
            "part": self.part,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "images": self.images,
            "update": self.update,
            "start_ms": round((self.start - origin) / 1e6, 4),
            "ms": round(self.ms, 4),
            "phases": [
                {
                    "name": name,
                    "start_ms": round((start - self.start) / 1e6, 4),
                    "ms": round((end - start) / 1e6, 4),
                }
                for name, start, end in self.phases
            ],
        }


class PhaseClock:
    """Installed as the run's phase timer for the window: times each phase of the current batch.

    :param synchronize: called before and after each phase (``torch.cuda.synchronize`` in the
        synchronised half on CUDA), or ``None``.
    :param annotate: ``annotate(name)`` returns a context manager entered around each phase
        (``torch.profiler.record_function`` while torch.profiler runs), or ``None``.
    """

    def __init__(self, annotate: Callable[[str], Any] | None = None) -> None:
        self.annotate = annotate
        self.synchronize: Callable[[], None] | None = None
        self.batch: BatchRecord | None = None
        self._label: Any = None

    def __call__(self, name: str) -> _Timed:
        return _Timed(self, name)

    def _start_batch(self, batch: BatchRecord, now: int) -> None:
        """The batch begins with its ``data`` phase (so an epoch boundary's validation and
        checkpoint lie outside it); under torch.profiler it is one annotated range."""
        batch.start = now
        if self.annotate is not None:
            self._label = self.annotate(f"falconet/batch {batch.index} {batch.part}")
            self._label.__enter__()

    def end_batch(self) -> BatchRecord:
        """Close the current batch (called from ``on_step_end``) and hand its record back."""
        record, self.batch = self.batch, None
        record.end = time.perf_counter_ns()
        if self._label is not None:
            self._label.__exit__(None, None, None)
            self._label = None
        return record


class _Timed:
    __slots__ = ("clock", "label", "name", "start")

    def __init__(self, clock: PhaseClock, name: str) -> None:
        self.clock, self.name, self.label = clock, name, None

    def __enter__(self) -> None:
        clock = self.clock
        if clock.synchronize is not None:
            clock.synchronize()
        self.start = time.perf_counter_ns()
        if self.name == "data" and clock.batch is not None and not clock.batch.start:
            clock._start_batch(clock.batch, self.start)
        if clock.annotate is not None:
            self.label = clock.annotate(f"falconet/{self.name}")
            self.label.__enter__()

    def __exit__(self, *exc: object) -> None:
        clock = self.clock
        if clock.synchronize is not None:
            clock.synchronize()
        end = time.perf_counter_ns()
        if self.label is not None:
            self.label.__exit__(None, None, None)
        if clock.batch is not None:
            clock.batch.phases.append((self.name, self.start, end))


def per_update_ms(batches: Sequence[BatchRecord], accumulate: int) -> float | None:
    """Milliseconds of one optimizer step's cycle: ``(accumulate - 1)`` plain batches and one
    updating batch, from the means of each kind in ``batches``.

    ``None`` when ``batches`` holds no updating batch (a window shorter than the accumulation),
    or, with ``accumulate > 1``, no plain one.
    """
    plain = [b.ms for b in batches if not b.update]
    updating = [b.ms for b in batches if b.update]
    if not updating:
        return None
    if accumulate <= 1:
        return statistics.fmean(updating)
    if not plain:
        return None
    return (accumulate - 1) * statistics.fmean(plain) + statistics.fmean(updating)


def describe(values: Sequence[float]) -> dict[str, float]:
    """Mean, median, standard deviation, min and max (0 for the spread of one value)."""
    if not values:
        return {"mean": 0.0, "median": 0.0, "std": 0.0, "min": 0.0, "max": 0.0}
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def half_timing(batches: Sequence[BatchRecord], accumulate: int) -> dict[str, Any]:
    """What one half of the window measured: step times, phase times per batch and per call,
    images per second, the loader-wait fraction and per-optimizer-step time."""
    total_ms = sum(b.ms for b in batches)
    images = sum(b.images for b in batches)
    phases: dict[str, dict[str, float]] = {}
    for batch in batches:
        for name, ms in batch.phase_ms().items():
            entry = phases.setdefault(name, {"ms": 0.0, "calls": 0})
            entry["ms"] += ms
            entry["calls"] += 1 if name == "other" else sum(p[0] == name for p in batch.phases)
    count = max(len(batches), 1)
    table = {
        name: {
            "ms_per_batch": entry["ms"] / count,
            "calls": int(entry["calls"]),
            "ms_per_call": entry["ms"] / max(entry["calls"], 1),
            "share": entry["ms"] / total_ms if total_ms else 0.0,
        }
        for name, entry in phases.items()
    }
    data_ms = phases.get("data", {"ms": 0.0})["ms"]
    return {
        "batches": len(batches),
        "optimizer_steps": sum(b.update for b in batches),
        "images": images,
        "step_ms": describe([b.ms for b in batches]),
        "img_per_s": images / (total_ms / 1000) if total_ms else 0.0,
        "loader_wait_fraction": data_ms / total_ms if total_ms else 0.0,
        "host_ms_per_batch": sum(
            v["ms_per_batch"] for k, v in table.items() if k not in ("data", "other")
        ),
        "update_ms": per_update_ms(batches, accumulate),
        "phases": table,
    }
