"""Autobatch's search on the CPU, against memory models of a step (what a GPU would report):
it returns a batch it measured to fit, the largest the model allows up to the shrink step, and
refuses loudly when nothing fits. The probe itself (the run's step on a GPU) is measured by
tools/bench_autobatch.py on the GPU machine."""

from __future__ import annotations

import pytest

from falconet.training.autobatch import (
    AUTO_FRACTION,
    box_count,
    choose_batch,
    refuse_off_gpu,
    wanted_fraction,
)
from falconet.training.config import ConfigError, TrainConfig

GIB = 2**30


def memory(fixed: float, per_image: float, capacity: float, curve: float = 0.0):
    """A step's peak bytes at a batch: fixed + per image (+ ``curve`` * batch**2, as an
    allocator's fragmentation grows with the batch), or None past the device's capacity."""

    def measure(batch: int) -> int | None:
        peak = fixed + per_image * batch + curve * batch**2
        return None if peak > capacity else int(peak)

    return measure


def test_a_linear_step_gets_the_largest_batch_under_the_budget():
    measure = memory(2 * GIB, 0.25 * GIB, 80 * GIB)
    choice = choose_batch(measure, budget=40 * GIB)
    assert choice.batch == 152  # (40 - 2) / 0.25
    assert choice.peak <= 40 * GIB and choice.peak == measure(152)
    assert [b for b, _ in choice.tried] == [8, 32, 152]  # two for the fit, one to confirm


def test_a_step_that_grows_faster_than_linear_is_shrunk_until_it_fits():
    measure = memory(2 * GIB, 0.25 * GIB, 80 * GIB, curve=0.002 * GIB)
    budget = 40 * GIB
    choice = choose_batch(measure, budget)
    assert choice.peak <= budget and measure(choice.batch) == choice.peak
    over = [b for b, p in choice.tried if p is None or p > budget]
    assert over, "the linear fit overshoots this step"
    edge = max(b for b in range(1, 400) if (m := measure(b)) is not None and m <= budget)
    assert 0.9 * edge <= choice.batch <= edge  # the line through the overshoot lands near it


def test_running_out_of_memory_above_the_second_probe_still_finds_a_batch():
    measure = memory(1 * GIB, 1 * GIB, capacity=20 * GIB)  # batch 32 runs out of memory
    choice = choose_batch(measure, budget=30 * GIB)
    assert 8 <= choice.batch <= 19 and choice.peak <= 20 * GIB
    assert (32, None) in choice.tried


def test_a_small_gpu_halves_down_and_nothing_fitting_is_an_error_naming_what_was_tried():
    assert choose_batch(memory(1 * GIB, 1 * GIB, 6 * GIB), budget=6 * GIB).batch == 4
    with pytest.raises(ConfigError, match=r"no batch fits .*batch 8: out of memory.*batch 1: "):
        choose_batch(memory(10 * GIB, 1 * GIB, 9 * GIB), budget=9 * GIB)


def test_the_batch_is_capped_by_the_largest_allowed():
    choice = choose_batch(memory(1 * GIB, 0.01 * GIB, 80 * GIB), budget=40 * GIB, largest=100)
    assert choice.batch == 100


def test_batch_keys_that_ask_for_autobatch():
    assert wanted_fraction(-1) == AUTO_FRACTION and wanted_fraction(0.7) == 0.7
    assert wanted_fraction(16) is None
    assert TrainConfig(batch="-1").batch == -1 and TrainConfig(batch="0.6").batch == 0.6
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="neither a number of images"):
            TrainConfig(batch=bad)


def test_autobatch_is_refused_off_the_gpu_with_the_fix():
    import torch

    with pytest.raises(ConfigError, match=r"batch=-1 .* on cpu; .* e\.g\. batch=16"):
        refuse_off_gpu(torch.device("cpu"), -1)


def test_synthetic_images_hold_twice_a_mosaics_mean_box_count():
    assert box_count(7.2, mosaic=1.0) == 58 and box_count(7.2, mosaic=0.0) == 15
    assert box_count(0.0, mosaic=1.0) == 1
