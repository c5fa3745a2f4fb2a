"""Autobatch: ``batch=-1`` (or a fraction such as ``batch=0.7``) picks the largest batch whose
real training step fits in that share of the GPU's free memory.

The step is measured, not estimated from the parameter count: for a candidate batch the probe
builds the run's own step (network, loss with its assigner, optimizer, precision and scaler,
EMA, and the chosen graph backend, whose recordings, whole-step's included, are made on the
probe's batches) and trains it on synthetic batches until the backend has recorded and
replayed, then runs validation's forward and decoding at its batch (twice the training batch)
with the recordings still held, as a run does between epochs. The peak of memory reserved by
PyTorch's allocator is the candidate's cost (:func:`probe_step`).

The search (:func:`choose_batch`) measures two batches, fits ``cost = fixed + per_image *
batch`` through them, takes the largest batch the line allows under the budget and measures
that one too. A candidate that costs more than the budget is replaced by the batch where the
line through it and the largest batch that fitted crosses as far below the budget as the
candidate went over it, at most 3% of the budget (the crossing of the budget itself landed a
few images short, over and over, on a step whose cost grows a little faster than linearly);
one that runs out of memory is shrunk by 15%. Each is measured again, so the batch chosen is
one that was seen to fit, never an extrapolation. Every measurement is logged with its
seconds.

Synthetic targets hold twice a mosaic's mean box count per image (four images' worth of the
train split's mean), so the loss, whose memory grows with the box count, is measured at the
box bucket above the typical one (and, with ``graph=whole-step``, whose first recording
records the bucket above its own as a run's does, at that bucket's too).

In a distributed run rank 0 probes on its GPU while the other ranks wait, then every rank
takes the global batch it chose (the per-rank batch times the world size); the GPUs of a run
are taken to be alike. On the CPU autobatch is refused: there is no device memory to fit.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from falconet.training.config import ConfigError

log = logging.getLogger("falconet.train")

AUTO_FRACTION = 0.8
"""The share of the GPU's free memory ``batch=-1`` fills."""

FIRST = 8
"""The per-rank batch measured first; the second is four times it."""

LARGEST = 1024
"""No per-rank batch above this is tried (nor above the rank's share of the train split)."""

SHRINK = 0.85
"""A candidate that runs out of memory is retried at this fraction of itself."""

MARGIN = 0.03
"""After an overshoot, the next candidate aims at most this share of the budget below it."""

TRIES = 4
"""Measurements after the two of the fit, at most."""


def wanted_fraction(batch: float) -> float | None:
    """The memory share ``batch`` asks autobatch for (``-1``: :data:`AUTO_FRACTION`; a
    fraction in ``(0, 1)``: itself), or ``None`` for a batch given as a number of images."""
    if batch == -1:
        return AUTO_FRACTION
    if 0 < batch < 1:
        return float(batch)
    return None


Measure = Callable[[int], int | None]
"""``measure(per_rank_batch) -> peak bytes``, or ``None`` when the step ran out of memory."""


@dataclass(frozen=True)
class Choice:
    """The chosen per-rank batch, its measured peak, and every measurement ``(batch, bytes or
    None)`` in the order taken."""

    batch: int
    peak: int
    tried: tuple[tuple[int, int | None], ...]


def choose_batch(measure: Measure, budget: int, largest: int = LARGEST) -> Choice:
    """The largest per-rank batch whose measured peak is at most ``budget`` bytes (module
    docstring); :class:`ConfigError` when not even one image fits."""
    tried: list[tuple[int, int | None]] = []
    fits: dict[int, int] = {}

    def fit(batch: int) -> bool:
        peak = measure(batch)
        tried.append((batch, peak))
        if peak is not None and peak <= budget:
            fits[batch] = peak
        return batch in fits

    small = min(FIRST, largest)
    if not fit(small):  # halve down to one image
        batch = small // 2
        while batch >= 1 and not fit(batch):
            batch //= 2
        return _chosen(fits, tried, budget)
    big = min(4 * small, largest)
    if big > small and fit(big):
        per_image = max((fits[big] - fits[small]) / (big - small), 1.0)
        fixed = fits[small] - per_image * small
    else:  # the fixed cost counted as per image: an estimate that errs small
        per_image, fixed = fits[small] / small, 0.0
    candidate = min(int((budget - fixed) / per_image), largest)
    for _ in range(TRIES):
        if candidate <= max(fits) or fit(candidate):
            break
        peak = tried[-1][1]
        below = max(fits)
        if peak is None:  # out of memory: no cost to draw a line through
            candidate = int(candidate * SHRINK)
            continue
        # over the budget: aim as far below the budget as this cost went over it (at most
        # MARGIN of it), on the line through the largest fit and this cost (the line's crossing
        # of the budget itself lay a few images short of each new overshoot, a probe each:
        # docs/lab/2026-12-autobatch.md)
        slope = (peak - fits[below]) / (candidate - below)
        target = budget - min(peak - budget, MARGIN * budget)
        candidate = min(below + int((target - fits[below]) / slope), candidate - 1)
    return _chosen(fits, tried, budget)


def _chosen(fits: dict[int, int], tried: list[tuple[int, int | None]], budget: int) -> Choice:
    if not fits:
        seen = ", ".join(f"batch {b}: {_gib(p)}" for b, p in tried)
        raise ConfigError(
            f"autobatch: no batch fits in the budget of {_gib(budget)} ({seen}); use a smaller "
            "imgsz or model, a larger memory share (batch=0.95), or a GPU with more memory"
        )
    best = max(fits)
    return Choice(best, fits[best], tuple(tried))


def _gib(peak: int | None) -> str:
    return "out of memory" if peak is None else f"{peak / 2**30:.2f} GiB"


def memory_budget(device: torch.device, fraction: float) -> tuple[int, int, int]:
    """``(budget, free, total)`` bytes: ``fraction`` of what is free on ``device`` now (other
    processes' memory and this one's CUDA context already taken)."""
    free, total = torch.cuda.mem_get_info(device)
    return int(free * fraction), free, total


def refuse_off_gpu(device: torch.device, batch: float) -> None:
    if device.type != "cuda":
        raise ConfigError(
            f"batch={batch:g} (autobatch) fits the batch to GPU memory, and this run is on "
            f"{device.type}; give the batch as a number of images, e.g. batch=16"
        )


@contextlib.contextmanager
def quiet():
    """The probe's steps log as a run would (graph choice, captures); keep that out of the
    run's log, which gets one line per measurement instead."""
    logger = logging.getLogger("falconet")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def timed_choice(
    measure: Measure, device: torch.device, fraction: float, largest: int = LARGEST
) -> Choice:
    """:func:`choose_batch` within ``fraction`` of ``device``'s free memory, logged."""
    budget, free, total = memory_budget(device, fraction)
    seconds_of: dict[int, float] = {}

    def timed(batch: int) -> int | None:
        start = time.perf_counter()
        try:
            return measure(batch)
        finally:
            seconds_of[batch] = time.perf_counter() - start

    start = time.perf_counter()
    with torch.random.fork_rng(devices=[device]):  # the probe's draws are not the run's
        choice = choose_batch(timed, budget, min(largest, LARGEST))
    seconds = time.perf_counter() - start
    log.info(
        "autobatch: %d images per GPU (peak %s of a %s budget: %.0f%% of %s free of %s) in "
        "%.1f s; measured %s",
        choice.batch,
        _gib(choice.peak),
        _gib(budget),
        fraction * 100,
        _gib(free),
        _gib(total),
        seconds,
        ", ".join(f"{b}: {_gib(p)} ({seconds_of[b]:.1f} s)" for b, p in choice.tried),
    )
    return choice


def peak_of(run_probe: Callable[[], None], device: torch.device) -> int | None:
    """The peak bytes reserved while ``run_probe()`` runs, or ``None`` if it ran out of
    memory; everything it made is freed before returning."""
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    try:
        run_probe()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_reserved(device)
    except torch.OutOfMemoryError:
        return None
    finally:
        gc.collect()
        torch.cuda.empty_cache()


def box_count(mean_boxes: float, mosaic: float) -> int:
    """Boxes per synthetic image: twice a mosaic's mean (four images' worth; one image's worth
    without mosaic), at least one."""
    per_image = mean_boxes * (4 if mosaic > 0 else 1)
    return max(1, math.ceil(2 * per_image))
