"""The loader's threads carry their names to the kernel, where per-thread tools read them."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from falconet.data.named_threads import NamedThreads


def kernel_name() -> str:
    return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()


@pytest.mark.skipif(sys.platform != "linux", reason="thread names at the kernel: Linux only")
def test_pool_threads_are_named_at_the_kernel():
    with NamedThreads(2, "falconet-plans") as pool:
        names = {pool.submit(kernel_name).result() for _ in range(8)}
        python = pool.submit(lambda: threading.current_thread().name).result()
    assert names == {"falconet-plans"}
    assert python == "falconet-plans"


@pytest.mark.skipif(sys.platform != "linux", reason="thread names at the kernel: Linux only")
def test_long_names_are_cut_to_the_kernels_fifteen_bytes():
    with NamedThreads(1, "falconet-a-very-long-name") as pool:
        assert pool.submit(kernel_name).result() == "falconet-a-very"
