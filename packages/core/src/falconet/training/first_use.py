"""The GPU's first use, paid on a thread of its own while the start-up imports.

A process's first forward, loss and backward on a GPU take about a second that no later
batch takes: cuDNN times its algorithms for each convolution's shapes (``cudnn.benchmark``),
and each kernel's module is loaded at its first launch. The start-up spends as long importing
modules the run needs anyway (``torch._dynamo``, which the optimizer's construction imports;
torchvision, the GPU cache's JPEG decoder): Python that holds the interpreter, while the GPU's
first use mostly waits in the driver and on the GPU with the interpreter released. So while
the training thread imports those modules (:func:`import_ahead`), a copy of the network trains
one synthetic batch on another thread (:func:`first_use_beside`), and the run's first batch
finds the kernels loaded and the backward's cuDNN choices made. The forward's are timed
again at the first batch: torch keeps cuDNN's timed choices per thread (the cuDNN v8 API's
benchmark cache is thread-local), and the forward runs on the thread that calls it, while the
backward runs on autograd's thread for the device whichever thread calls it.

The copy keeps the run out of it: the batch-norm statistics it updates and the gradients it
gets are its own, it draws no random numbers from the run's generators (the synthetic batch
has generators of its own, and what the network or its loss draws comes from the generators'
states as they were, put back after it), and its loss sees this process alone
(:func:`falconet.ops.rank_local`, per thread), so in a distributed run it issues no
collective. The training thread queues no GPU work while the copy runs, so cuDNN times its
algorithms on a GPU that runs nothing else. Only autocast backends are used this way: a
backend that converts the network (FP8) keeps state per module that a copy would share.

Two threads import at once here. Python's per-module import locks make that safe unless the
modules the two import form a cycle between them. The copy's thread imports only what its
forward and loss import lazily: for YOLO with ``tal``, the assigner's implementation
(``falconet_detect.assigners.tal`` and ``.common``, ``imports_off_main`` in
tools/bench_startup.py's results), which import nothing the training thread is importing.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from falconet import ops
from falconet.data.targets import Targets
from falconet.interfaces import PrecisionBackend
from falconet.precision import AutocastPrecision

log = logging.getLogger("falconet.train")

SWITCH_INTERVAL_S = 0.0005
"""The interpreter's switch interval while the copy trains: the copy's thread takes the
interpreter back after each operation it launches, and at Python's default interval
(``sys.getswitchinterval()``) it waits that long for the importing thread to give it up,
hundreds of times (the copy's time at both intervals: docs/data.md, start-up)."""

WAIT_S = 300.0
"""The longest the training thread waits for the copy before it goes on without it."""


def synthetic_batch(
    batch: int, size: int, boxes: int, classes: int, device: torch.device
) -> tuple[torch.Tensor, Targets]:
    """Random images ``[batch, 3, size, size]`` (channels_last, as the loaders give them) and
    ``boxes`` random boxes per image, from generators of their own."""
    generator = torch.Generator().manual_seed(0)
    corners = torch.rand(batch, boxes, 2, 2, generator=generator) * size
    xyxy = torch.cat((corners.amin(2), corners.amax(2) + 1.0), -1).clamp(max=size)
    labels = torch.randint(0, classes, (batch, boxes), generator=generator)
    counts = torch.full((batch,), boxes, dtype=torch.long)
    targets = Targets.from_padded(xyxy, labels, counts).to(device)
    pixels = torch.Generator(device).manual_seed(0)
    images = torch.rand(batch, 3, size, size, generator=pixels, device=device)
    return images.contiguous(memory_format=torch.channels_last), targets


def import_ahead(modules: Sequence[str]) -> None:
    """Import ``modules`` now, on this thread (the ones the run would import later anyway)."""
    for name in modules:
        importlib.import_module(name)


@contextlib.contextmanager
def first_use_beside(
    model: nn.Module,
    loss_for: Callable[[nn.Module], Callable[[Any, Targets], tuple[torch.Tensor, Any]]],
    precision: PrecisionBackend,
    synthetic: tuple[int, int, int, int],
    device: torch.device,
) -> Iterator[None]:
    """Inside, a copy of ``model`` with its own loss (``loss_for(copy)``) trains one batch
    of :func:`synthetic_batch` (``synthetic``: images, size, boxes per image, classes) on a
    thread, the random generators' states put back after it; on exit the
    thread is waited for and the copy's memory given back to the device. Nothing runs (the
    body alone) off CUDA or under a precision backend that converts the network."""
    if device.type != "cuda" or not isinstance(precision, AutocastPrecision):
        yield
        return
    replica = copy.deepcopy(model).train()
    held = {"network": replica, "loss": loss_for(replica)}  # emptied on exit
    done: dict[str, Any] = {}

    def run() -> None:
        start = time.perf_counter()
        try:
            # a family's forward or loss may draw (DETR's denoising): from states put back
            drawn = torch.random.fork_rng(devices=[device])
            with torch.cuda.device(device), ops.rank_local(), drawn:
                images, targets = synthetic_batch(*synthetic, device=device)
                with precision.autocast(device):
                    outputs = held["network"](images)
                total, _ = held["loss"](outputs, targets)
                total.backward()
                torch.cuda.synchronize(device)
        except Exception as exc:  # the first batch pays for the first use instead
            done["error"] = exc
        done["seconds"] = time.perf_counter() - start

    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL_S))
    thread = threading.Thread(target=run, name="falconet-first-use", daemon=True)
    began = time.perf_counter()
    thread.start()
    try:
        yield
    finally:
        waited = time.perf_counter()
        thread.join(WAIT_S)
        sys.setswitchinterval(interval)
        report(done, thread.is_alive(), time.perf_counter() - waited, waited - began)
        held.clear()
        del replica
        if not thread.is_alive():
            torch.cuda.empty_cache()  # the copy's blocks: the device's again, for the cache's check


def report(done: dict[str, Any], alive: bool, waited: float, beside: float) -> None:
    """Log how the copy's batch went: its seconds, and how long the training thread waited."""
    if alive:
        log.warning(
            "the GPU's first use (a copy of the network on a synthetic batch) has not finished "
            "after %.0f s; the run goes on without it",
            WAIT_S,
        )
    elif "error" in done:
        log.warning(
            "the GPU's first use on a copy of the network failed (%s); the first batch pays "
            "for it instead",
            done["error"],
        )
    else:
        log.info(
            "first use: a copy of the network trained a synthetic batch in %.2f s beside %.2f s "
            "of start-up, %.2f s waited for",
            done["seconds"],
            beside,
            waited,
        )
