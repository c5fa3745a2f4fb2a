"""Checkpoints: written atomically, read with ``torch.load(weights_only=True)``.

A checkpoint holds only tensors, numbers, strings and containers of them, so the restricted
unpickler accepts it and a file from elsewhere cannot run code. ``last.pt`` holds the full state
of a run (model, EMA, optimizer, scaler, counters, every RNG, the configuration, versions);
``best.pt`` only what inference needs (weights and the model's description).

Writing goes to a temporary file in the same folder, is flushed and fsynced, then renamed over
the target (atomic on POSIX), and the folder is fsynced: a crash at any moment leaves either
the old file or the new one, never a torn one.

The trainer writes through a :class:`CheckpointWriter`: the state is copied to host memory
at the epoch's last batch (so the next epoch's updates cannot reach the file;
:mod:`~falconet.training.host_snapshot` says how, in a few copies) and serialised and fsynced
on a background thread a few batches into the next epoch (:meth:`CheckpointWriter.hold`):
written in place, the two files (the optimizer state included, two fsyncs) held the training
thread for a sizeable share of a short epoch, and the training thread now waits only for the
snapshot
(``tools/bench_checkpoint.py`` measures both; the record is in
docs/lab/2026-11-end-to-end-and-accuracy.md).
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import random
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from falconet.training.host_snapshot import PinnedSnapshot

FORMAT = 1

log = logging.getLogger("falconet.train")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read; the message says why and what to do."""


def save_atomic(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` to ``path`` so that a crash never leaves a partial file there."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path


class CheckpointWriter:
    """Writes checkpoints on a background thread, one batch of files after another.

    :meth:`submit` (:meth:`copy` then :meth:`write`) snapshots the states to host memory on
    the caller's thread (:class:`~falconet.training.host_snapshot.PinnedSnapshot`: a few
    copies queued on the stream, no wait for them) and returns; the files are written by
    :func:`save_atomic`, so a crash mid-write leaves the previous checkpoint, in the order
    submitted. :meth:`wait` blocks until the submitted files are on disk and raises a
    :class:`CheckpointError` if writing them failed (a full disk, a vanished folder), so a
    failed write stops the run at the next copy (the trainer's: the next epoch's last batch)
    instead of passing unnoticed. A write can be held (:meth:`hold`): the thread then waits
    for the snapshot's copies and for :meth:`release` before serialising anything.

    One thread writes every file until :meth:`wait`: a thread started for each write made the
    caller wait for the new thread's start, at the epoch's end, where the GPU waits for the
    caller (the next epoch's first launch). It is a daemon, so a caller that never waits
    cannot keep the interpreter from exiting; the trainer waits before it returns or raises.

    A snapshot's buffers are reused at the next copy but one: when the previous files are
    still being written as the next copy comes (an epoch shorter than serialising and
    fsyncing its files), the copy goes into a second snapshot instead of waiting for them, and
    waits only for the files written from that one, two copies back. The second snapshot's
    pinned memory is allocated the first time a write overlaps a copy, never otherwise.
    """

    SNAPSHOTS = 2

    def __init__(self) -> None:
        self._error: BaseException | None = None
        self._snapshots = [PinnedSnapshot() for _ in range(self.SNAPSHOTS)]
        # per snapshot, set once the files copied into it are written (None: nothing pending)
        self._written: list[threading.Event | None] = [None] * self.SNAPSHOTS
        self._current = 0  # the snapshot of the last copy
        self._jobs: queue.SimpleQueue | None = None  # the thread's, while it runs
        self._thread: threading.Thread | None = None
        self._go = threading.Event()
        self._go.set()

    def hold(self) -> None:
        """Let the next :meth:`write` serialise only once :meth:`release` is called (or
        :meth:`wait`): serialising holds the GIL, and the trainer keeps it off the next
        epoch's first launches (``falconet.training.trainer.write_release_batch`` says why)."""
        self._go.clear()

    def release(self) -> None:
        """Let a held :meth:`write` serialise now."""
        self._go.set()

    @property
    def held(self) -> bool:
        """Whether the next or running :meth:`write` waits for :meth:`release`."""
        return not self._go.is_set()

    def submit(self, files: list[tuple[dict[str, Any], Path]]) -> None:
        """Write each ``(state, path)`` of ``files`` in order, in the background."""
        copies = self.copy([state for state, _ in files])
        self.write([(copy, path) for copy, (_, path) in zip(copies, files, strict=True)])

    def copy(self, states: list[Any]) -> list[Any]:
        """Host copies of ``states`` for :meth:`write` (their tensors' copies queued, not
        waited for: the writer's thread waits), valid until the next copy but one. The trainer
        copies at the epoch's last batch, while the GPU still runs the epoch's last steps,
        and writes at the epoch's end. Waits only where the files of both snapshots are still
        being written (class docstring); raises what a finished write failed with."""
        if _pending(self._written[self._current]):
            self._current = (self._current + 1) % self.SNAPSHOTS
        written = self._written[self._current]
        if written is not None:
            self._go.set()  # a held write would never end
            written.wait()
        self._written[self._current] = None
        self._raise_failure()
        return self._snapshots[self._current].take(states)

    def write(self, files: list[tuple[dict[str, Any], Path]]) -> None:
        """Write ``files``, whose states hold only host tensors (the last :meth:`copy`'s), in
        the background, after the files submitted before them."""
        files = [(state, Path(path)) for state, path in files]
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            self._thread = threading.Thread(
                target=self._work, args=(self._jobs,), name="falconet-checkpoint", daemon=True
            )
            self._thread.start()
        written = threading.Event()
        self._jobs.put((files, self._snapshots[self._current].copied, written))
        self._written[self._current] = written

    def wait(self) -> None:
        """Block until the submitted files are written (the thread then ends); raise if
        writing failed."""
        self._go.set()
        if self._jobs is not None:
            self._jobs.put(None)
            self._thread.join()
            self._jobs = self._thread = None
        self._written = [None] * self.SNAPSHOTS
        self._raise_failure()

    def close(self) -> None:
        """:meth:`wait`, logging a failed write instead of raising: for the way out of a run
        that is already ending with an exception of its own."""
        try:
            self.wait()
        except CheckpointError as exc:
            log.error("%s", exc)

    def _raise_failure(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(
                f"writing a checkpoint failed: {error}. The previous checkpoint is intact; "
                "free disk space or fix the run folder's permissions and resume from it"
            ) from error

    def _work(self, jobs: queue.SimpleQueue) -> None:
        """The writer's thread: each job's files in turn, until :meth:`wait`'s ``None``."""
        while (job := jobs.get()) is not None:
            files, copied, written = job
            try:
                if copied is not None:
                    copied.synchronize()
                self._go.wait()
                for state, path in files:
                    save_atomic(state, path)
            except BaseException as exc:  # re-raised on the training thread by copy() or wait()
                self._error = self._error or exc
            finally:
                written.set()


def _pending(written: threading.Event | None) -> bool:
    return written is not None and not written.is_set()


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a falconet checkpoint with the restricted unpickler (``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if found is None:
            raise CheckpointError(
                f"{path}: not a readable checkpoint (torn or not a torch "
                f"file: {str(exc).strip().splitlines()[0]})"
            ) from None
        raise CheckpointError(
            f"{path}: refused: it holds {found.group(1)}, which loading with weights_only=True "
            "does not allow. falconet never unpickles arbitrary objects, since that can run "
            "code; re-save the weights as a plain state_dict of tensors"
        ) from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise CheckpointError(f"{path}: not a readable checkpoint ({exc})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: not a falconet checkpoint (format {FORMAT} expected); "
            "a bare state_dict can be loaded with Detector(model).load_weights(path)"
        )
    return state


def load_matching_weights(
    module: torch.nn.Module, weights: dict[str, torch.Tensor]
) -> tuple[int, list[str]]:
    """Copy every tensor of ``weights`` whose name and shape match ``module``'s; returns how many
    were copied and the names left out. Fine-tuning a checkpoint on data with other classes
    keeps everything but the class-dependent head layers, as users of detection trainers expect.
    """
    own = module.state_dict()
    matching = {k: v for k, v in weights.items() if k in own and own[k].shape == v.shape}
    module.load_state_dict(matching, strict=False)
    return len(matching), sorted(set(own) - set(matching))


def rng_states() -> dict[str, Any]:
    """Every RNG a run draws from, as tensors and plain numbers (weights_only safe)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": {"version": version, "state": list(internal), "gauss": py_gauss},
    }


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    n = states["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    p = states["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
