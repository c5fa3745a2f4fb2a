"""The epoch-end snapshot of a run's GPU state: a few copies into pinned buffers, kept.

A checkpoint's state (model, EMA, optimizer: about 1,250 tensors for yolo-n) must be copied to
host memory before the next epoch changes it. Copied tensor by tensor, that is one
``cudaMemcpyAsync`` and one pinned allocation per tensor on the training thread (13-16 ms at
every epoch's end on the H200, docs/data.md), and torch then stores each tensor's storage as its
own record. Here the tensors of one section of the state (the top-level key they are first met
under: ``weights``, ``model``, ``optimizer``, ...) and one dtype are gathered on the device by
``torch.cat`` (a few batched kernels) and brought to the host by one copy into a pinned buffer
allocated on the first snapshot and reused while the state keeps its layout. The snapshot's
tensors are views of those buffers, with the live tensors' strides (a channels_last weight
stays channels_last), so ``torch.save`` writes one record per buffer and a file holds only the
sections it names: ``best.pt`` (its ``weights``) holds the ``weights`` buffers, not the
optimizer's.

A tensor met twice (the EMA's weights are both ``last.pt``'s ``weights`` and its ``ema``
state, and ``best.pt``'s ``weights``: each ``state_dict()`` call makes new tensor objects of the
same memory) is copied once: tensors are the same when their memory and layout are.

The buffers are reused, so a snapshot is valid until the next :meth:`PinnedSnapshot.take`: the
:class:`~falconet.training.checkpoint.CheckpointWriter` waits for the previous files before
taking the next. Host tensors (the RNG states; every tensor of a run on the CPU) are cloned,
once each.
"""

from __future__ import annotations

from typing import Any

import torch

Key = tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...]]


def tensor_key(t: torch.Tensor) -> Key:
    """What makes two tensor objects the same tensor: their memory and layout."""
    return (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))


def memory_order(t: torch.Tensor) -> list[int] | None:
    """The permutation of ``t``'s dimensions that is contiguous (``t.permute(order)``), or
    ``None`` where ``t`` is not dense (then it is gathered in its logical order)."""
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    return order if t.permute(order).is_contiguous() else None


class PinnedSnapshot:
    """Copies the CUDA tensors of a list of states into pinned buffers (module docstring)."""

    def __init__(self) -> None:
        self._signature: tuple | None = None
        self._buffers: list[torch.Tensor] = []
        self._views: list[torch.Tensor] = []

    @property
    def copies_queued(self) -> bool:
        """Whether the last :meth:`take` queued copies from a GPU (then wait for them)."""
        return bool(self._buffers)

    def take(self, states: list[Any]) -> list[Any]:
        """``states`` with every tensor replaced by a host copy (containers rebuilt). The CUDA
        tensors' copies are queued on the current stream without waiting: read them only after
        an event recorded after this call has completed."""
        found: dict[Key, tuple[str, torch.Tensor]] = {}
        for state in states:
            items = state.items() if isinstance(state, dict) else [("", state)]
            for section, value in items:
                for t in cuda_tensors(value):
                    found.setdefault(tensor_key(t), (section, t))
        groups: dict[tuple[str, torch.dtype], list[torch.Tensor]] = {}
        for section, t in found.values():
            groups.setdefault((section, t.dtype), []).append(t)
        signature = tuple(
            (group, tuple((tuple(t.shape), tuple(t.stride())) for t in tensors))
            for group, tensors in groups.items()
        )
        if signature != self._signature:
            self._allocate(groups)
            self._signature = signature
        views = iter(self._views)
        memo: dict[Key, torch.Tensor] = {}
        with torch.no_grad():
            for buffer, tensors in zip(self._buffers, groups.values(), strict=True):
                parts = []
                for t in tensors:
                    order = memory_order(t)
                    parts.append(t.reshape(-1) if order is None else t.permute(order).reshape(-1))
                    memo[tensor_key(t)] = next(views)
                buffer.copy_(torch.cat(parts), non_blocking=True)
        return [rebuilt(state, memo) for state in states]

    def _allocate(self, groups: dict[tuple[str, torch.dtype], list[torch.Tensor]]) -> None:
        self._buffers, self._views = [], []
        for (_, dtype), tensors in groups.items():
            buffer = torch.empty(sum(t.numel() for t in tensors), dtype=dtype, pin_memory=True)
            offset = 0
            for t in tensors:
                part = buffer[offset : offset + t.numel()]
                order = memory_order(t)
                if order is None:
                    view = part.view(t.shape)
                else:  # the live tensor's strides: its memory order, permuted back
                    inverse = sorted(range(t.dim()), key=order.__getitem__)
                    view = part.view([t.shape[d] for d in order]).permute(inverse)
                self._views.append(view)
                offset += t.numel()
            self._buffers.append(buffer)


def cuda_tensors(state: Any):
    """Every CUDA tensor of a nested state, in order."""
    if isinstance(state, torch.Tensor):
        if state.is_cuda:
            yield state.detach()
    elif isinstance(state, dict):
        for value in state.values():
            yield from cuda_tensors(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from cuda_tensors(value)


def rebuilt(state: Any, memo: dict[Key, torch.Tensor]) -> Any:
    """``state`` with its containers rebuilt, its CUDA tensors replaced by their views in
    ``memo`` and its host tensors cloned (once each, remembered in ``memo``)."""
    if isinstance(state, torch.Tensor):
        key = tensor_key(state)
        if key not in memo:
            memo[key] = state.detach().clone()
        return memo[key]
    if isinstance(state, dict):
        return {k: rebuilt(v, memo) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(rebuilt(v, memo) for v in state)
    return state
