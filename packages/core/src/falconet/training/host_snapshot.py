"""The epoch-end snapshot of a run's GPU state: a few copies into pinned buffers, kept.

A checkpoint's state (model, EMA, optimizer: about 1,250 tensors for yolo-n) must be copied to
host memory before the next epoch changes it. Copied tensor by tensor, that is one
``cudaMemcpyAsync`` and one pinned allocation per tensor on the training thread (what it cost
against this module is measured in docs/checkpoints.md), and torch then stores each
tensor's storage as its own record. Here the tensors of one section of the state (the top-level
key they are first met under: ``weights``, ``model``, ``optimizer``, ...) and one dtype are
gathered on the device by ``torch.cat`` (a few batched kernels, on the caller's stream: the
state as it is at that point of the stream) and brought to the host by one copy into a pinned
buffer allocated on the first snapshot and reused while the state keeps its layout. The copies
run on a stream of the snapshot's own: the caller's stream goes on without them (its next wait
for the GPU, the epoch's log read, does not wait for some 50 MB to cross to the host), and
:attr:`PinnedSnapshot.copied` says when they are done. The snapshot's tensors are views of
those buffers, with the live tensors' strides (a channels_last weight stays channels_last), so
``torch.save`` writes one record per buffer and a file holds only the sections it names:
``best.pt`` (its ``weights``) holds the ``weights`` buffers, not the optimizer's.

A tensor met twice (the EMA's weights are both ``last.pt``'s ``weights`` and its ``ema``
state, and ``best.pt``'s ``weights``: each ``state_dict()`` call makes new tensor objects of the
same memory) is copied once: tensors are the same when their memory and layout are.

The buffers are reused, so a snapshot is valid until the next :meth:`PinnedSnapshot.take`: the
:class:`~falconet.training.checkpoint.CheckpointWriter` keeps two, and takes the next copy into
one whose files are written. Host tensors (the RNG states; every tensor of a run on the CPU)
are cloned, once each.
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
        self._signature: list | None = None
        self._buffers: list[torch.Tensor] = []
        self._parts: list[list[torch.Tensor]] = []  # per buffer: the live tensors, flattened
        self._views: list[torch.Tensor] = []  # per CUDA tensor met, in order: its snapshot
        # tensors that are not dense, whose flattening is a copy made again at each snapshot:
        # (buffer, part, tensor)
        self._regather: list[tuple[int, int, torch.Tensor]] = []
        self._stream: torch.cuda.Stream | None = None  # the copies' (created at the first)
        self.copied: torch.cuda.Event | None = None
        """Recorded on the copies' stream after the last :meth:`take`'s copies (``None``
        when it copied nothing from a GPU): wait for it before reading the snapshot."""

    def take(self, states: list[Any]) -> list[Any]:
        """``states`` with every tensor replaced by a host copy (containers rebuilt). The CUDA
        tensors' copies are queued without waiting: read them only after :attr:`copied`.

        The layout (which tensors go to which buffer, and their views) is worked out once and
        kept while the states hold the same tensors (the same memory, shapes and strides),
        which is every epoch of a run: then a snapshot costs one pass over the states, a few
        gathers and one copy per buffer (about 1,250 tensors for yolo-n)."""
        met = list(sections(states))
        signature = [(s, t.data_ptr(), t.dtype, t.shape, t.stride()) for s, t in met]
        if signature != self._signature:
            self._lay_out(met)
            self._signature = signature
        with torch.no_grad():
            for b, i, t in self._regather:
                self._parts[b][i] = t.reshape(-1)
            gathered = [torch.cat(parts) for parts in self._parts]
        self.copied = None
        if gathered:
            device = gathered[0].device
            if self._stream is None:
                self._stream = torch.cuda.Stream(device)
            self._stream.wait_stream(torch.cuda.current_stream(device))  # after the gathers
            with torch.cuda.stream(self._stream):
                for buffer, flat in zip(self._buffers, gathered, strict=True):
                    buffer.copy_(flat, non_blocking=True)
                    flat.record_stream(self._stream)  # not reused before it is copied
                self.copied = torch.cuda.Event()
                self.copied.record()
        views, clones = iter(self._views), {}
        return [rebuilt(state, views, clones) for state in states]

    def _lay_out(self, met: list[tuple[str, torch.Tensor]]) -> None:
        """Buffers, gathers and views for the tensors ``met`` (in order, with their
        sections): one buffer per section and dtype; a tensor met twice gets one view."""
        first: dict[Key, torch.Tensor] = {}
        groups: dict[tuple[str, torch.dtype], list[torch.Tensor]] = {}
        for section, t in met:
            if tensor_key(t) not in first:
                first[tensor_key(t)] = t
                groups.setdefault((section, t.dtype), []).append(t)
        self._buffers, self._parts, self._regather = [], [], []
        view_of: dict[Key, torch.Tensor] = {}
        for (_, dtype), tensors in groups.items():
            buffer = torch.empty(sum(t.numel() for t in tensors), dtype=dtype, pin_memory=True)
            parts, offset = [], 0
            for t in tensors:
                part = buffer[offset : offset + t.numel()]
                order = memory_order(t)
                if order is None:  # not dense: gathered in its logical order, at each take
                    self._regather.append((len(self._buffers), len(parts), t))
                    parts.append(t.reshape(-1))
                    view_of[tensor_key(t)] = part.view(t.shape)
                else:  # in its memory order, and viewed back with the live tensor's strides
                    parts.append(t.permute(order).reshape(-1))
                    inverse = sorted(range(t.dim()), key=order.__getitem__)
                    shape = [t.shape[d] for d in order]
                    view_of[tensor_key(t)] = part.view(shape).permute(inverse)
                offset += t.numel()
            self._buffers.append(buffer)
            self._parts.append(parts)
        self._views = [view_of[tensor_key(t)] for _, t in met]


def sections(states: list[Any]):
    """``(section, tensor)`` for every CUDA tensor of ``states``, in order; a tensor's section
    is the top-level key of its state (``""`` for a state that is not a dict)."""
    for state in states:
        items = state.items() if isinstance(state, dict) else [("", state)]
        for section, value in items:
            for t in cuda_tensors(value):
                yield section, t


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


def rebuilt(state: Any, views, clones: dict[Key, torch.Tensor]) -> Any:
    """``state`` with its containers rebuilt, each CUDA tensor replaced by the next of
    ``views`` (the order :func:`sections` met them in) and each host tensor cloned (once,
    remembered in ``clones``)."""
    if isinstance(state, torch.Tensor):
        if state.is_cuda:
            return next(views)
        key = tensor_key(state)
        if key not in clones:
            clones[key] = state.detach().clone()
        return clones[key]
    if isinstance(state, dict):
        return {k: rebuilt(v, views, clones) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(rebuilt(v, views, clones) for v in state)
    return state
