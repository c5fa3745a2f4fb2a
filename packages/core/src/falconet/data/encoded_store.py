"""The image files' bytes as they are on disk, for decoding per batch on the GPU.

``cache=encoded`` holds every file's bytes in host memory: a JPEG as it is stored, about a
seventh of its decoded size at 640 px (COCO's train2017: ~19 GB of files, ~135 GiB decoded).
Reader threads fill the store in the background while training starts; a batch that needs a
file not held yet reads it from disk, so the start-up does not grow with the dataset.
``cache=stream`` holds nothing and reads each batch's files from disk, a few batches ahead.
Either way the bytes are decoded on the GPU (:mod:`falconet.data.gpu_decode`).

Why host memory and not GPU memory: torchvision's nvJPEG decoder takes the encoded bytes as
host tensors (its header parse runs on the host, and the hardware decoder of the A100, H100
and H200 reads host buffers), so bytes held on the GPU would be copied back for every batch.

The store is one flat buffer (``numpy.empty``: the pages are committed as the readers write
them) with an offset per file, never one Python object per file: a buffer per file above
glibc's mmap threshold is a memory map of its own, and a million of them exceed the kernel's
map count.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from falconet.data.named_threads import name_this_thread

log = logging.getLogger("falconet.data")

FILL_THREADS = 4
"""Reader threads that fill a held store (a file read releases the GIL)."""

FILL_CHUNK = 256
"""Files a reader claims at a time."""


def file_sizes(paths: Sequence[Path], threads: int = 8) -> np.ndarray:
    """``[n]`` int64 bytes of each file, ``-1`` where it cannot be read (``os.stat``, the
    files split among a few threads: a stat releases the GIL)."""
    paths = list(paths)
    sizes = np.full(len(paths), -1, np.int64)

    def stat_part(start: int) -> None:
        for i in range(start, min(start + FILL_CHUNK * 16, len(paths))):
            with contextlib.suppress(OSError):  # unreadable: -1, reported where it is read
                sizes[i] = os.stat(paths[i]).st_size

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(stat_part, range(0, len(paths), FILL_CHUNK * 16)))
    return sizes


class EncodedFiles:
    """The bytes of ``paths`` (module docstring): held in host memory with ``hold``, else
    read from disk at every :meth:`read`. ``sizes`` (:func:`file_sizes`) where the caller has
    them already."""

    def __init__(
        self, paths: Sequence[Path], *, hold: bool, sizes: np.ndarray | None = None
    ) -> None:
        self.paths = [p if isinstance(p, Path) else Path(p) for p in paths]  # no re-parse
        self.sizes = file_sizes(self.paths) if sizes is None else np.asarray(sizes, np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(np.maximum(self.sizes, 0))))
        self.hold = hold
        self.held = np.zeros(len(self.paths), bool)
        self.buffer = np.empty(int(self.offsets[-1]) if hold else 0, np.uint8)
        self.fill_seconds: float | None = None
        self._next = 0
        self._claim = threading.Lock()
        self._stop = threading.Event()
        self._readers: list[threading.Thread] = []

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def nbytes(self) -> int:
        """The files' bytes in all (what a held store takes in host memory)."""
        return int(self.offsets[-1])

    def start_filling(self, threads: int = FILL_THREADS) -> None:
        """Start the reader threads that fill a held store; returns at once."""
        if not self.hold or self._readers:
            return
        started = time.perf_counter()
        done = threading.Barrier(threads, action=lambda: self._filled(started))
        self._readers = [
            threading.Thread(
                target=self._fill, args=(done,), name=f"falconet-fill-{k}", daemon=True
            )
            for k in range(threads)
        ]
        for reader in self._readers:
            reader.start()

    def _filled(self, started: float) -> None:
        self.fill_seconds = time.perf_counter() - started
        if not self._stop.is_set():
            log.info(
                "cache=encoded: %d files (%.2f GiB) held in host memory, filled in %.1f s "
                "beside training",
                int(self.held.sum()),
                self.nbytes / 2**30,
                self.fill_seconds,
            )

    def _fill(self, done: threading.Barrier) -> None:
        name_this_thread("falconet-fill")
        view = memoryview(self.buffer)
        while not self._stop.is_set():
            with self._claim:
                start, self._next = self._next, self._next + FILL_CHUNK
            if start >= len(self.paths):
                break
            for i in range(start, min(start + FILL_CHUNK, len(self.paths))):
                size = int(self.sizes[i])
                if size <= 0 or self._stop.is_set():
                    continue
                try:
                    with open(self.paths[i], "rb", buffering=0) as f:
                        read = f.readinto(view[self.offsets[i] : self.offsets[i] + size])
                        # a file that changed size since the layout is read at each use
                        whole = read == size and not f.read(1)
                except OSError:
                    continue  # read from disk at each use, where the error is reported
                self.held[i] = whole
        with contextlib.suppress(threading.BrokenBarrierError):  # a reader that died
            done.wait()

    def wait_filled(self, timeout: float | None = None) -> bool:
        """Wait for the readers (benchmarks and tests); whether the fill ended."""
        for reader in self._readers:
            reader.join(timeout)
        return not any(r.is_alive() for r in self._readers)

    def close(self) -> None:
        """Stop the readers (a run that ends before its store is full)."""
        self._stop.set()

    def read(self, index: int) -> np.ndarray:
        """File ``index``'s bytes, ``[size]`` uint8: a view of the store where it holds them,
        else read from disk. Raises ``OSError`` where the file cannot be read."""
        if self.held[index]:
            return self.buffer[self.offsets[index] : self.offsets[index + 1]]
        with open(self.paths[index], "rb", buffering=0) as f:
            data = np.empty(os.fstat(f.fileno()).st_size, np.uint8)
            if not len(data) or f.readinto(memoryview(data)) != len(data):
                raise OSError(f"{self.paths[index]}: empty, or shorter than its size")
        return data
