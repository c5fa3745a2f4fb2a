"""The window's arithmetic: which batches are discarded, unsynchronised, synchronised, and the
per-batch and per-optimizer-step figures under gradient accumulation."""

from __future__ import annotations

import pytest

from falconet_profiler.window import BatchRecord, PhaseClock, Window, half_timing, per_update_ms


def test_window_parts_split_the_measured_batches_in_halves():
    window = Window(warmup=5, steps=20)
    parts = [window.part(i) for i in range(27)]
    assert parts == ["warmup"] * 5 + ["unsynced"] * 10 + ["synced"] * 10 + ["after"] * 2
    odd = Window(warmup=0, steps=5)
    assert (odd.unsynced, odd.synced, odd.end) == (3, 2, 5)  # the verdict's half is the larger
    with pytest.raises(ValueError):
        Window(warmup=0, steps=1)


def _batch(index: int, ms: float, update: bool, images: int = 8) -> BatchRecord:
    phases = [("data", 0, 1_000_000), ("forward", 1_000_000, 3_000_000)]
    if update:
        phases.append(("optimizer", 3_000_000, 4_000_000))
    return BatchRecord(index, "unsynced", images=images, start=0, end=int(ms * 1e6), phases=phases)


def test_per_update_time_is_one_accumulation_cycle():
    # accumulate 4: three plain batches of 10 ms and one updating batch of 16 ms per cycle
    batches = [_batch(i, 16.0 if i % 4 == 3 else 10.0, i % 4 == 3) for i in range(8)]
    assert per_update_ms(batches, accumulate=4) == pytest.approx(3 * 10 + 16)
    # a window shorter than the accumulation holds no optimizer step: no per-update figure
    assert per_update_ms(batches[:3], accumulate=4) is None
    # without accumulation every batch updates: the per-update time is the batch time
    assert per_update_ms([_batch(i, 12.0, True) for i in range(3)], 1) == pytest.approx(12)


def test_half_timing_reports_per_batch_and_per_call_phase_times():
    batches = [_batch(i, 16.0 if i % 2 else 10.0, bool(i % 2)) for i in range(4)]
    half = half_timing(batches, accumulate=2)
    assert half["batches"] == 4 and half["optimizer_steps"] == 2
    assert half["step_ms"]["mean"] == pytest.approx(13.0)
    assert half["img_per_s"] == pytest.approx(32 / 0.052)
    assert half["loader_wait_fraction"] == pytest.approx(4 / 52)
    assert half["update_ms"] == pytest.approx(10 + 16)
    optimizer = half["phases"]["optimizer"]
    assert optimizer["calls"] == 2 and optimizer["ms_per_call"] == pytest.approx(1.0)
    assert optimizer["ms_per_batch"] == pytest.approx(0.5)  # per batch, over all 4
    assert half["phases"]["other"]["ms_per_batch"] == pytest.approx(13.0 - 3 - 0.5)
    assert half["host_ms_per_batch"] == pytest.approx(2 + 0.5)  # forward + optimizer


def test_the_clock_times_phases_and_starts_the_batch_at_its_data_phase():
    calls: list[str] = []
    clock = PhaseClock(annotate=None)
    clock.synchronize = lambda: calls.append("sync")
    clock.batch = BatchRecord(3, "synced")
    with clock("data"):
        pass
    with clock("forward"):
        pass
    record = clock.end_batch()
    assert [name for name, _, _ in record.phases] == ["data", "forward"]
    assert record.start == record.phases[0][1] and record.end >= record.phases[-1][2]
    assert calls == ["sync"] * 4  # before and after each phase
    assert clock.batch is None
