"""The profiler's training keys, declared through ``register_train_keys`` (docs/profiling.md)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from falconet.keys import KeyGroup


class ProfilerKeys(BaseModel):
    """``profile`` turns the profiler on for a run; the others shape its window."""

    profile: bool = Field(
        False, description="measure a window of steps and say why a step is slow (profiler)"
    )
    profile_warmup: int = Field(
        5, ge=0, description="profile: batches discarded after the first optimizer step"
    )
    profile_steps: int = Field(
        20, ge=2, description="profile: batches measured (half unsynchronised, half synchronised)"
    )
    profile_then_stop: bool = Field(
        False, description="profile: end the run after the window, saving no partial epoch"
    )


PROFILER_KEYS = KeyGroup("profiler", "the profiler's window (profile=true)", ProfilerKeys)
