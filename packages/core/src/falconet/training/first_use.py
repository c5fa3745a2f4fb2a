"""The GPU's first use, paid on the training thread while the start-up goes on beside it.

A process's first forward, loss and backward on a GPU take about a second that no later
batch takes: cuDNN times its algorithms for each convolution's shapes (``cudnn.benchmark``),
and each kernel's module is loaded at its first launch. The start-up spends as long importing
modules the run needs anyway and, with ``cache=gpu``, filling the GPU cache: work that mostly
holds the interpreter or waits on the disk and the decoders, while the GPU's first use mostly
waits in the driver and on the GPU with the interpreter released. So while other threads make
the imports and fill the cache, the training thread trains a copy of the network on one
synthetic batch, and the run's first batch finds cuDNN's choices made and the kernels loaded.
The imports are ``torch._dynamo``'s, which the optimizer's construction makes: the slowest of
a run (docs/lab/2026-12-cache-gpu-history.md, start-up), on a thread of their own
(:func:`imports_ahead`). They start with the copy, not earlier, though they depend on nothing
the run reads: the data check and the network's construction before it hold the interpreter,
and an import beside them slowed them by about as much as it overlapped, where the copy mostly
waits with the interpreter released (the measurement: docs/lab/2026-12-cache-gpu-history.md,
start-up). The cache fills on a third thread (:func:`run_beside_first_use`'s ``start_up``), and
imports torchvision there where it decodes with nvJPEG (:mod:`falconet.data.gpu_cache`).

The copy trains on the training thread, not on another, because torch keeps cuDNN's timed
choices per thread (the cuDNN v8 API's benchmark cache is thread-local): choices made on
another thread would be timed again at the first batch's forward. The backward's convolutions
run on autograd's own thread for the device, whichever thread called ``backward``.

The copy keeps the run out of it: the batch-norm statistics it updates and the gradients it
gets are its own, it draws no random numbers from the run's generators (the synthetic batch
has generators of its own, and what the network or its loss draws comes from the generators'
states as they were, put back after it), and its loss sees this process alone
(:func:`falconet.ops.rank_local`, per thread), so in a distributed run it issues no
collective. The cache's memory is checked against the device's free memory read before the
copy took any (the caller reads it): the cache may take half of it, and the copy, one batch
of the step's own size, needs no more than the step will in the other half. Only autocast
backends are used this way: a backend that converts the network (FP8) keeps state per module
that a copy would share.

Threads import at once here. The training thread imports what the copy's forward, loss and
backward import on first use: the assigner's implementation, and modules of torch's that the
backward loads, some of which ``torch._dynamo``'s import on the imports' thread reaches too,
as torchvision's on the start-up's thread reaches ``torch._dynamo``. Python's per-module
import locks make that safe: a thread wanting a module another is importing waits for it, and
a cycle of two such waits is detected and broken by handing one thread the partly initialised
module, which only a module needing its importer at import time would notice. Neither
``torch._dynamo`` nor torchvision sets a signal handler when imported, which only the main
thread may do. Both threads are done before the loaders' workers fork (a child forked while
another thread holds an import lock would wait on it for ever).

The start-up's thread is a daemon: a run interrupted while it starts (Ctrl-C) raises at once
on the training thread instead of waiting for the cache to fill.
"""

from __future__ import annotations

import copy
import importlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import torch
from torch import nn

from falconet import ops
from falconet.contract import PrecisionBackend
from falconet.data.targets import Targets
from falconet.precision import AutocastPrecision

log = logging.getLogger("falconet.train")

SWITCH_INTERVAL_S = 0.0005
"""The interpreter's switch interval while the copy trains: the training thread takes the
interpreter back after each operation of the copy it launches, and at Python's default
interval (``sys.getswitchinterval()``) it waits that long for the importing thread to give it
up, hundreds of times (the copy's time at both intervals: docs/lab/2026-12-cache-gpu-history.md,
start-up)."""

T = TypeVar("T")


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


def imports_ahead(modules: Sequence[str]) -> threading.Thread:
    """A daemon thread, started, that imports ``modules`` (the ones the run would import later
    anyway) while the caller goes on; join it before forking. A module that fails to import
    there is left for the run's own import, which raises where the module is needed."""

    def run() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # raised again, with its context, by the run's own import
                continue

    thread = threading.Thread(target=run, name="falconet-imports", daemon=True)
    thread.start()
    return thread


def run_beside_first_use(
    start_up: Callable[[], T],
    model: nn.Module,
    loss_for: Callable[[nn.Module], Callable[[Any, Targets], tuple[torch.Tensor, Any]]],
    precision: PrecisionBackend,
    synthetic: tuple[int, int, int, int],
    device: torch.device,
    imports: Sequence[str] = (),
) -> T:
    """``start_up()`` on a thread, and ``imports`` (:func:`imports_ahead`) on another, while
    this thread trains a copy of ``model`` with its own loss (``loss_for(copy)``) on one batch
    of :func:`synthetic_batch` (``synthetic``: images, size, boxes per image, classes), the
    random generators' states put back after it; then the copy's memory is given back to the
    device. Returns, once both threads are done, what ``start_up`` returns, and raises what it
    raises. Off CUDA, or under a precision backend that converts the network, ``start_up``
    runs on this thread and nothing beside it (the run then makes the imports where it needs
    them)."""
    if device.type != "cuda" or not isinstance(precision, AutocastPrecision):
        return start_up()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL_S))
    try:
        importing = imports_ahead(imports)
        started = _started_beside(start_up, device)
        seconds, error = _train_a_copy(model, loss_for, precision, synthetic, device)
        copied = time.perf_counter()
        result = started.result()  # what start_up raised is raised here
        importing.join()  # no import lock held when the loaders' workers fork
        report(seconds, error, time.perf_counter() - copied)
    finally:  # also on Ctrl-C, without waiting for the start-up's thread
        sys.setswitchinterval(interval)
        torch.cuda.empty_cache()  # the copy's blocks: the device's again
    return result


def _started_beside(function: Callable[[], T], device: torch.device) -> Future[T]:
    """``function`` running on a daemon thread (:func:`_on_a_stream_of_its_own`): its result,
    or what it raised, in the future returned."""
    done: Future[T] = Future()

    def run() -> None:
        try:
            done.set_result(_on_a_stream_of_its_own(function, device))
        except BaseException as exc:  # handed to the training thread
            done.set_exception(exc)

    threading.Thread(target=run, name="falconet-start-up", daemon=True).start()
    return done


def _on_a_stream_of_its_own(function: Callable[[], T], device: torch.device) -> T:
    """``function()`` with ``device`` current on this thread (a new thread's is the first
    GPU, whatever the training thread's is) and a stream of its own current on it, waited for
    before returning. The copy's convolutions are timed on the training thread's stream, and
    cuDNN times a candidate by events around it on that stream: GPU work of the start-up's
    queued there (the cache's resizes, and the waits for nvJPEG: torchvision decodes on a
    stream of its own and makes the caller's stream wait for each batch) would run between
    the events and be counted to whichever candidate it fell beside, and a slower candidate
    could be kept for the whole run."""
    stream = torch.cuda.Stream(device)
    with torch.cuda.device(device), torch.cuda.stream(stream):
        result = function()
    stream.synchronize()  # what it left on the device is there for the training thread
    return result


def _train_a_copy(model, loss_for, precision, synthetic, device) -> tuple[float, Exception | None]:
    """Forward, loss and backward of a copy of ``model`` on a synthetic batch, on this thread:
    its seconds and the error that stopped it (the first batch then pays for the first use)."""
    start = time.perf_counter()
    try:
        replica = copy.deepcopy(model).train()
        loss = loss_for(replica)
        # a family's forward or loss may draw (DETR's denoising): from states put back
        drawn = torch.random.fork_rng(devices=[device])
        with torch.cuda.device(device), ops.rank_local(), drawn:
            images, targets = synthetic_batch(*synthetic, device=device)
            with precision.autocast(device):
                outputs = replica(images)
            total, _ = loss(outputs, targets)
            total.backward()
            torch.cuda.synchronize(device)
    except Exception as exc:  # its traceback would hold the copy's memory
        return time.perf_counter() - start, exc.with_traceback(None)
    return time.perf_counter() - start, None


def report(seconds: float, error: Exception | None, waited: float) -> None:
    """Log how the copy's batch went: its seconds, and how long the training thread then
    waited for the start-up beside it."""
    if error is not None:
        log.warning(
            "the GPU's first use on a copy of the network failed (%s); the first batch pays "
            "for it instead",
            error,
        )
        return
    log.info(
        "first use: a copy of the network trained a synthetic batch in %.2f s beside the "
        "start-up, which then took %.2f s more",
        seconds,
        waited,
    )
