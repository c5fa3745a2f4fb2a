"""What a training step needs of the other ranks of a distributed run, as one typed object.

The step seam hands a graph backend these collectives (``StepParts.collectives``) rather than
the process group: the gradients averaged once per update (what DDP's reducer does), rank 0's
buffers (BatchNorm's running statistics) on every rank after an update, and agreement on
host-side numbers (the batch's shape and target bucket), so every rank records and replays
the same graphs at the same step. Gradients and buffers travel over the run's process group
(NCCL on GPUs, whose collectives a CUDA graph can record); the host's numbers travel over a
Gloo group, so agreeing on them is a round trip between the hosts, never a wait on the device.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import torch
import torch.distributed as dist


class RankCollectives:
    """The collectives of a run of ``size`` ranks; every method is one collective that every
    rank must call at the same point of the run, in the same order.

    :param size: the world size.
    :param host_group: a Gloo group for numbers kept on the host (``None``: the default group,
        which is Gloo already on the CPU).
    """

    def __init__(self, size: int, host_group: dist.ProcessGroup | None = None) -> None:
        self.size = size
        self.host_group = host_group

    @torch.no_grad()
    def average_gradients_(self, flat: torch.Tensor) -> None:
        """``flat`` (this rank's gradients, summed over its batches) becomes the mean over the
        ranks, made as DDP's reducer makes it: each rank's times ``1 / size``, then summed. With
        a power-of-two world the product is exact, so the mean is bit for bit DDP's."""
        flat.mul_(1.0 / self.size)
        dist.all_reduce(flat)

    @torch.no_grad()
    def broadcast_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Rank 0's values of ``tensors`` on every rank, in place: one broadcast of a flat copy
        per dtype (BatchNorm's float statistics and its integer batch counters)."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for tensor in tensors:
            by_dtype.setdefault(tensor.dtype, []).append(tensor)
        for group in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in group])
            dist.broadcast(flat, src=0)
            views = flat.split([t.numel() for t in group])
            torch._foreach_copy_(
                group, [v.view(t.shape) for v, t in zip(views, group, strict=True)]
            )

    def agree_max(self, values: Sequence[int]) -> list[int]:
        """Each of ``values``' largest value over the ranks (one all-reduce on the host)."""
        numbers = torch.tensor(list(values), dtype=torch.int64)
        dist.all_reduce(numbers, op=dist.ReduceOp.MAX, group=self.host_group)
        return numbers.tolist()


def rank_collectives(size: int, timeout_s: float) -> RankCollectives | None:
    """The collectives of this process's group (``None`` outside a distributed run). On NCCL
    a Gloo group is made beside it for the host's numbers (every rank makes it here, at the
    same point of the set-up, as a new group requires), with the same ``timeout_s``."""
    if size < 2 or not dist.is_initialized():
        return None
    host = None
    if dist.get_backend() != "gloo":
        host = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return RankCollectives(size, host)
