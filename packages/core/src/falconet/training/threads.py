"""The CPU threads of a run: ``threads=`` for torch, OpenMP and OpenCV in the training process.

torch and OpenMP size their pools from the machine's cores, not from what this process may use:
in a container given 2 of a host's 64 cores, or under ``taskset``, they start 64 threads on 2
cores, and every parallel CPU op pays for the oversubscription. ``threads=0`` (the default)
takes the cores the process may use (its CPU affinity, and the cgroup's CPU quota where one is
set), shared among the node's ranks (``LOCAL_WORLD_SIZE``, as torchrun sets it); a number sets
them. Loader workers (separate processes, one thread each) and the loader's own threads are not
counted here: ``workers=`` is capped by the same usable cores.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

log = logging.getLogger("falconet.train")

CGROUP = Path("/sys/fs/cgroup")


def cgroup_quota(root: Path = CGROUP) -> float | None:
    """The CPUs the cgroup's quota allows (``cpu.max`` of cgroup v2, ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us`` of v1), or ``None`` where no quota is set or none can be read."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def usable_cores(root: Path = CGROUP) -> int:
    """The cores this process may use: its affinity, at most the cgroup quota (rounded up)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_quota(root)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def thread_count(requested: int, cores: int, local_ranks: int = 1) -> int:
    """``requested`` threads, or with 0 this rank's share of ``cores``."""
    if requested > 0:
        return requested
    return max(1, cores // max(1, local_ranks))


def apply_threads(requested: int) -> int:
    """Set torch's, OpenMP's (for processes started from now on) and OpenCV's thread counts
    for this process; returns the count, logged with where it came from."""
    import torch

    cores = usable_cores()
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    count = thread_count(requested, cores, local_ranks)
    torch.set_num_threads(count)
    os.environ["OMP_NUM_THREADS"] = str(count)
    try:
        import cv2

        cv2.setNumThreads(count)
    except ImportError:  # OpenCV comes with the core; a stripped install still trains
        pass
    source = "threads=" if requested else f"{cores} usable core(s), {local_ranks} rank(s) a node"
    log.info("threads: %d for torch, OpenMP and OpenCV (%s)", count, source)
    return count
