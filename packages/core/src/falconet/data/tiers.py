"""Where a run's training images live: the tier ``cache=auto`` takes, by the numbers it logs.

From fastest to the most room, every tier decodes or augments on the GPU:

* ``gpu``: decoded once into GPU memory (``imgsz x imgsz x 3`` bytes an image,
  :mod:`falconet.data.gpu_cache`), where that takes at most
  :data:`~falconet.data.gpu_cache.STORE_SHARE` of the free GPU memory;
* ``encoded``: the files' bytes in host memory, decoded per batch by nvJPEG into a ring on
  the GPU (:mod:`falconet.data.encoded_store`, :mod:`falconet.data.gpu_decode`), where the
  bytes take at most :data:`HOST_SHARE` of the host memory available to this process;
* ``stream``: the same decode, the bytes read from disk for each batch.

``none`` (the CPU workers reading the files) is taken on a CUDA device only where no GPU
decoder is installed (torchvision) and the decoded store does not fit; off CUDA it is the only
choice. A run picks the tier by name with ``cache=`` as well (docs/data.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from falconet.data.gpu_cache import STORE_SHARE

GPU_TIERS = ("gpu", "encoded", "stream")
"""The caches whose batches are augmented on the GPU, fastest first."""

HOST_SHARE = 0.5
"""The largest share of the host memory available to a process that ``cache=auto`` lets its
encoded store take (the rest is the validation loader's, the checkpoints' and the system's)."""

GIB = 2**30


@dataclass(frozen=True)
class Footing:
    """What the choice is made from, for this rank.

    :param images: training images this rank holds (its shard).
    :param decoded_bytes: their decoded store's bytes (``images x imgsz^2 x 3``).
    :param encoded_bytes: their files' bytes (``None`` where not counted: the decoded store
        fits, and nothing else is looked at).
    :param ring_bytes: the decoding ring's GPU bytes.
    :param gpu_free: free bytes on the device.
    :param host_available: host bytes available to this process (its node's share).
    :param gpu_decoder: whether nvJPEG is installed (torchvision).
    """

    images: int
    decoded_bytes: int
    encoded_bytes: int | None
    ring_bytes: int
    gpu_free: int
    host_available: int
    gpu_decoder: bool

    def decoded_fits(self) -> bool:
        return self.decoded_bytes <= STORE_SHARE * self.gpu_free

    def describe(self) -> str:
        """The numbers, as the log line gives them."""
        encoded = (
            "" if self.encoded_bytes is None else f", files {self.encoded_bytes / GIB:.2f} GiB"
        )
        return (
            f"{self.images} images: decoded {self.decoded_bytes / GIB:.2f} GiB{encoded}; "
            f"{self.gpu_free / GIB:.1f} GiB free on the GPU (at most {STORE_SHARE:.0%} for "
            f"images), {self.host_available / GIB:.1f} GiB of host memory available (at most "
            f"{HOST_SHARE:.0%} for files)"
        )


def choose_tier(footing: Footing) -> tuple[str, str]:
    """``(tier, why)`` for a CUDA device (module docstring)."""
    if footing.decoded_fits():
        return "gpu", "the decoded images fit in GPU memory"
    if not footing.gpu_decoder:
        return "none", (
            "the decoded images do not fit in GPU memory and no GPU decoder is installed, so "
            "the CPU workers read the files; pip install torchvision (the build matching "
            "torch) to decode them on the GPU"
        )
    if footing.ring_bytes > STORE_SHARE * footing.gpu_free:
        return "none", "not even the decoding ring fits in GPU memory: the CPU workers decode"
    if footing.encoded_bytes is not None and (
        footing.encoded_bytes <= HOST_SHARE * footing.host_available
    ):
        return "encoded", "the files fit in host memory, decoded per batch on the GPU"
    return "stream", "the files do not fit in host memory: read per batch, decoded on the GPU"


def host_available() -> int:
    """Host bytes available to this process: Linux's ``MemAvailable`` (free plus what the
    page cache gives back), else the free pages, shared among the node's ranks
    (``LOCAL_WORLD_SIZE``, as torchrun sets it)."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if available is None:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return available // max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
