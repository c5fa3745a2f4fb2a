"""Which samples a rank reads, in which order, epoch after epoch: the resumable sampler.

:class:`EpochSampler` yields ``(epoch, index)`` pairs, a permutation seeded by
``(seed, epoch)`` shared out among the ranks, so the epoch reaches persistent workers with
each index (they never see ``set_epoch`` calls made in the main process);
:class:`EpochBatchSampler` cuts them into batches over a span of epochs. Both the CPU loader
(:func:`falconet.data.loader.build_loader`) and ``cache=gpu``'s
(:mod:`falconet.data.gpu_loader`) read their batches from them.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


class EpochSampler(torch.utils.data.Sampler):
    """Yields ``(epoch, index)``: a permutation seeded by ``(seed, epoch)``, this rank's share.

    Every rank draws the same permutation and takes every ``world_size``-th element from its
    ``rank`` (padded by repeating from the start so ranks get equal counts, as
    ``DistributedSampler`` does). ``set_epoch(epoch, start)`` skips the first ``start`` indices
    of this rank's share: exact mid-epoch resume with ``start = batches_done * batch``.
    """

    def __init__(
        self, size: int, *, shuffle: bool = True, seed: int = 0, rank: int = 0, world_size: int = 1
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def _share(self) -> list[int]:
        return self.share(self.epoch)

    def share(self, epoch: int) -> list[int]:
        """This rank's whole share of ``epoch``, in order (``start`` not skipped)."""
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(self.size, generator=generator).tolist()
        else:
            order = list(range(self.size))
        per_rank = -(-self.size // self.world_size)
        order += order[: per_rank * self.world_size - len(order)]
        return order[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((self.epoch, i) for i in self._share()[self.start :])

    def __len__(self) -> int:
        return max(0, -(-self.size // self.world_size) - self.start)


class EpochBatchSampler(torch.utils.data.Sampler):
    """Batches of an :class:`EpochSampler`, epoch after epoch over a span of epochs.

    A batch never mixes two epochs (an epoch's last batch may be short). Over a span
    (:meth:`set_epochs`), one loader iterator runs through every epoch of a run, so the
    workers prepare the next epoch's first batches while this one's last steps and its
    validation run, instead of starting cold at every epoch (with few batches per epoch, as
    in a fine-tune on a small set, that start-up was a large share of the time). The
    samples are those of per-epoch iteration: each is a function of ``(seed, epoch, index)``.
    """

    def __init__(self, sampler: EpochSampler, batch: int) -> None:
        self.sampler, self.batch = sampler, batch
        self.first, self.last, self.start = 0, 1, 0

    @property
    def batches_per_epoch(self) -> int:
        """Batches in a whole epoch of this rank's share."""
        share = -(-self.sampler.size // self.sampler.world_size)
        return -(-share // self.batch)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """One epoch, from its ``start``-th sample (exact mid-epoch resume)."""
        self.set_epochs(epoch, epoch + 1, start)

    def set_epochs(self, first: int, last: int, start: int = 0) -> None:
        """Epochs ``first`` to ``last - 1``, the first from its ``start``-th sample."""
        self.first, self.last, self.start = first, last, start

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for epoch in range(self.first, self.last):
            self.sampler.set_epoch(epoch, self.start if epoch == self.first else 0)
            indices = list(self.sampler)
            for i in range(0, len(indices), self.batch):
                yield indices[i : i + self.batch]

    def __len__(self) -> int:
        epochs = max(self.last - self.first, 0)
        skipped = self.start // self.batch if epochs else 0
        return epochs * self.batches_per_epoch - skipped
