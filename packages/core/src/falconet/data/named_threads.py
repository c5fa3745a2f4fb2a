"""The loader's threads under their own names where the operating system shows them.

Python's thread names (``thread_name_prefix=``) live in the interpreter only: ``top -H``,
``py-spy``, ``/proc/<pid>/task/*/comm`` and the benchmarks' CPU seconds by thread
(``tools/bench_scale.py``) see every loader thread as ``python``, so a run whose planning,
decoding or reading thread is the busy one cannot say which. On Linux each thread started here
also takes its name at the kernel (``prctl(PR_SET_NAME)``, at most 15 bytes); elsewhere only the
Python name is set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

PR_SET_NAME = 15
"""``prctl`` option that names the calling thread (linux/prctl.h)."""

_libc = (
    ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None
)


def name_this_thread(name: str) -> None:
    """Give the calling thread ``name`` at the kernel as well (module docstring)."""
    threading.current_thread().name = name
    if _libc is not None:
        _libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


class NamedThreads(ThreadPoolExecutor):
    """A thread pool whose threads the kernel knows as ``name`` (one name for the pool: the
    CPU seconds of its threads are summed by name anyway)."""

    def __init__(self, workers: int, name: str) -> None:
        super().__init__(
            workers, thread_name_prefix=name, initializer=name_this_thread, initargs=(name,)
        )
