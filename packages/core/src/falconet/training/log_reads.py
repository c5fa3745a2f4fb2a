"""Reading the epoch's loss sums back to the host without draining the GPU's queue.

The loop sums the losses and the non-finite counter on the device and reads them every
``log_interval`` batches. A blocking read (``.tolist()``) waits for every step queued so far:
the GPU then sits idle until the host has queued the next batch (its loader's hand-over, the
targets' copies, the step's launch), at every read: three times besides its end in an epoch of
32 batches at the default ``log_interval``. :class:`LaggedReads` reads mid-epoch values one
interval late instead: each read queues a copy of the values into pinned host memory and
returns those of the previous read, long done by then, so it never waits for the GPU. The
epoch's last read waits (the epoch's row needs its own values), as does any read on a device
that has no queue.
"""

from __future__ import annotations

import torch


class LaggedReads:
    """Mid-epoch reads of a device tensor, one read late (module docstring)."""

    def __init__(self) -> None:
        self._pending: tuple[torch.Tensor, torch.cuda.Event | None] | None = None

    def read(self, values: torch.Tensor, *, now: bool) -> list[float] | None:
        """The values of the previous read (``None`` at the first of an epoch, after
        :meth:`reset`), and ``values`` queued for the next; with ``now``, ``values`` themselves
        (this waits for the device), and nothing left queued. ``values`` must not be changed
        in place afterwards (the loop's sums are new tensors at every step)."""
        if now:
            self._pending = None
            return values.tolist()
        if values.is_cuda:
            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            done: torch.cuda.Event | None = torch.cuda.Event()
            done.record()
        else:
            host, done = values, None
        previous, self._pending = self._pending, (host, done)
        if previous is None:
            return None
        host, done = previous
        if done is not None:
            done.synchronize()  # recorded an interval ago: done unless the GPU is that far behind
        return host.tolist()

    def reset(self) -> None:
        """Forget a queued read (a new epoch starts)."""
        self._pending = None
