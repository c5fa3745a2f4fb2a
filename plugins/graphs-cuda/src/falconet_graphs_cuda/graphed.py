"""Which calls of the network replay a recording, which run eager, and when a recording retires.

:class:`GraphedNetwork` stands in for the network (the family's capture region). Per call:

* a call that does not train (no grad, or the module in eval mode) runs eager;
* the **state** a recording depends on is the parameters (which tensors, and their storage),
  the module hooks, the
  autocast setting and the train/eval mode; when any of it changes, every recording retires
  (a replay would read old storage, skip a hook or run the wrong precision) and shapes are
  counted afresh;
* the **key** of a recording is the input's shape, strides and dtype; a key is recorded on its
  ``capture_after``-th call and replayed from then on; until then (the partial last batch,
  a ``multi_scale`` size before its third batch: one key per size of the run's fixed set) it
  runs eager;
* a recording that fails is logged once and its key runs eager for the rest of the run: the
  recorder restores what its warm-up touched, and no weight has changed (see
  docs/performance.md for how the GPU check established that this is safe).

A replay returns gradients that live in the recording's static buffers. Autograd hands such a
tensor to ``param.grad`` as it is when ``param.grad`` is ``None``, so with gradient
accumulation the next replay would overwrite the gradient already accumulated (``g0 + g1``
would become ``2 * g1``). Before each replay, :meth:`GraphedNetwork._unalias` gives every
``param.grad`` that aliases a static buffer its own copy; without accumulation the optimizer
has consumed and dropped the gradient before the next replay, so nothing is copied.

A replay's output gradients are copied into static buffers too, and their layout is not
neutral: the backward reduces over them (a convolution's bias gradient is a sum over batch
and pixels), and on the GPU a sum over a channels-last buffer adds in another order than over
the strided slice the loss hands back, which made fp32 replays differ from eager in the last
bits of the head's bias gradients. So the eager calls before a key is recorded note the
strides of the gradients the loss sends back (:meth:`GraphedNetwork._watch`), and the
recorder lays its buffers out the same way (:func:`grad_buffer`).

The recorder is injected (:mod:`falconet_graphs_cuda.recording` records CUDA graphs), which
is what lets the CPU tests drive this logic with a recorder that has the same buffer
semantics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from falconet.contract import CaptureStats

log = logging.getLogger("falconet.train")


class Recording(Protocol):
    """One captured forward and backward, with static buffers that replays read and write.

    ``forward()`` reads ``static_input`` and writes ``outputs`` (flat, in the order of
    ``spec``); ``backward()`` reads ``grad_outputs`` (one per differentiable output, made by
    :func:`grad_buffer`) and writes ``grads`` (one per parameter, ``None`` where a parameter
    is unused).
    """

    static_input: torch.Tensor
    outputs: Sequence[torch.Tensor]
    differentiable: Sequence[bool]
    spec: Any
    grad_outputs: Sequence[torch.Tensor]
    grads: Sequence[torch.Tensor | None]

    def forward(self) -> None: ...

    def backward(self) -> None: ...


GradStrides = Sequence[tuple[int, ...] | None] | None
"""Per differentiable output, the strides of the gradient the loss sent back (None: unseen)."""

Recorder = Callable[[nn.Module, torch.Tensor, Sequence[nn.Parameter], GradStrides], Recording]
"""``recorder(network, sample_input, params, grad_strides) -> Recording``; raises when it
cannot record."""


def grad_buffer(output: torch.Tensor, stride: tuple[int, ...] | None) -> torch.Tensor:
    """The static buffer that one output's gradient is copied into before a backward replay,
    laid out as the loss's gradient was in the eager calls (``stride``), so the captured
    backward reduces over it in eager's order; the output's own layout where the gradient's
    is unknown or overlaps itself (an expanded gradient, stride 0, cannot be a buffer)."""
    if stride is None or len(stride) != output.dim() or not _non_overlapping(output.shape, stride):
        return torch.empty_like(output)
    return torch.empty_strided(output.shape, stride, dtype=output.dtype, device=output.device)


def _non_overlapping(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """No two indices of a tensor of this shape and stride share an element."""
    reach = 0  # the largest offset the dimensions with smaller strides reach
    for step, size in sorted((s, n) for n, s in zip(shape, stride, strict=True) if n > 1):
        if step <= reach:
            return False
        reach += (size - 1) * step
    return True


class _Replay(torch.autograd.Function):
    """Autograd node of one replay: the parameters are inputs so autograd accumulates their
    gradients (and runs their tensor hooks) as it would for the eager network."""

    @staticmethod
    def forward(ctx, recording: Recording, images: torch.Tensor, *params: torch.Tensor):
        ctx.recording = recording
        recording.static_input.copy_(images)
        recording.forward()
        outputs = tuple(out.detach() for out in recording.outputs)
        ctx.mark_non_differentiable(
            *(o for o, d in zip(outputs, recording.differentiable, strict=True) if not d)
        )
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs: torch.Tensor):
        recording: Recording = ctx.recording
        wanted = (g for g, d in zip(grad_outputs, recording.differentiable, strict=True) if d)
        for static, grad in zip(recording.grad_outputs, wanted, strict=True):
            static.copy_(grad)
        recording.backward()
        grads = tuple(None if g is None else g.detach() for g in recording.grads)
        return (None, None, *grads)


class GraphedNetwork:
    """Calls ``network`` eagerly or by replaying a recording of it (module docstring)."""

    def __init__(self, network: nn.Module, recorder: Recorder, capture_after: int = 3) -> None:
        if capture_after < 1:
            raise ValueError(f"capture_after={capture_after}: must be at least 1")
        self.network = network
        self.recorder = recorder
        self.capture_after = capture_after
        self.params = [p for p in network.parameters() if p.requires_grad]
        self.modules = list(network.modules())
        self.recordings: dict[tuple, Recording] = {}
        self.seen: dict[tuple, int] = {}
        self.failed: dict[tuple, str] = {}
        self.grad_strides: dict[tuple, list[tuple[int, ...] | None]] = {}
        self.state: tuple | None = None
        self.counts = {"replayed": 0, "eager": 0, "recorded": 0, "retired": 0, "failed": 0}
        self.capture_seconds = 0.0  # host wall time of every recording: warm-up and capture

    # ---------------------------------------------------------------------------- per call
    def __call__(self, images: torch.Tensor) -> Any:
        self.params = [p for p in self.network.parameters() if p.requires_grad]
        state = self._state(images.device.type)
        if state != self.state:
            if self.recordings:
                log.info(
                    "graph=cuda-graph: %d recording(s) retired (%s changed)",
                    len(self.recordings),
                    self._what_changed(self.state, state),
                )
                self.counts["retired"] += len(self.recordings)
            self.recordings.clear()
            self.seen.clear()
            self.state = state
        if not (torch.is_grad_enabled() and self.network.training):
            return self._eager(images)
        key = (tuple(images.shape), images.stride(), images.dtype)
        recording = self.recordings.get(key)
        if recording is None:
            recording = self._maybe_record(key, images)
            if recording is None:
                outputs = self._eager(images)
                return outputs if key in self.failed else self._watch(key, outputs)
        self._unalias(recording)
        self.counts["replayed"] += 1
        outputs = _Replay.apply(recording, images, *self.params)
        return tree_unflatten(list(outputs), recording.spec)

    def stats(self) -> CaptureStats:
        """The recordings so far (:class:`falconet.contract.CaptureStats`); pending until
        the first recording is made or fails."""
        pending = not self.recordings and not self.failed
        return CaptureStats.from_counts(
            self.counts, pending=pending, capture_seconds=self.capture_seconds
        )

    def _eager(self, images: torch.Tensor) -> Any:
        self.counts["eager"] += 1
        return self.network(images)

    def _watch(self, key: tuple, outputs: Any) -> Any:
        """Note, when the backward reaches them, the strides of the gradients of ``outputs``
        (an eager call of a key not yet recorded), for the recording's buffers."""
        wanted = [o for o in tree_flatten(outputs)[0] if o.requires_grad]
        strides: list[tuple[int, ...] | None] = [None] * len(wanted)
        self.grad_strides[key] = strides
        for i, out in enumerate(wanted):
            out.register_hook(lambda grad, i=i: strides.__setitem__(i, tuple(grad.stride())))
        return outputs

    def _maybe_record(self, key: tuple, images: torch.Tensor) -> Recording | None:
        if key in self.failed:
            return None
        seen = self.seen[key] = self.seen.get(key, 0) + 1
        if seen < self.capture_after:
            return None
        start = time.perf_counter()
        try:
            recording = self.recorder(self.network, images, self.params, self.grad_strides.get(key))
        except Exception as exc:  # a failed capture comes in many types; each is logged
            self.capture_seconds += time.perf_counter() - start
            self.failed[key] = describe_failure(exc)
            self.counts["failed"] += 1
            log.error(
                "graph=cuda-graph could not capture the network for input %s: %s; that shape "
                "runs eager for the rest of the run",
                list(key[0]),
                self.failed[key],
            )
            return None
        seconds = time.perf_counter() - start
        self.capture_seconds += seconds
        self.recordings[key] = recording
        self.counts["recorded"] += 1
        log.info(
            "graph=cuda-graph: captured forward and backward for input %s in %.0f ms",
            list(key[0]),
            seconds * 1e3,
        )
        return recording

    def _unalias(self, recording: Recording) -> None:
        """Give each ``param.grad`` that is a recording's static buffer its own storage."""
        for param, static in zip(self.params, recording.grads, strict=True):
            grad = param.grad
            if grad is not None and static is not None and grad.data_ptr() == static.data_ptr():
                param.grad = grad.clone()

    # ------------------------------------------------------------------------------- state
    def _state(self, device_type: str) -> tuple:
        hooks = sum(
            len(m._forward_hooks)
            + len(m._forward_pre_hooks)
            + len(m._backward_hooks)
            + len(m._backward_pre_hooks)
            for m in self.modules
        )
        return (
            tuple((id(p), p.data_ptr()) for p in self.params),
            hooks,
            torch.is_autocast_enabled(device_type),
            torch.get_autocast_dtype(device_type),
            self.network.training,
        )

    @staticmethod
    def _what_changed(old: tuple | None, new: tuple) -> str:
        names = ("parameters", "hooks", "autocast", "autocast dtype", "train/eval mode")
        if old is None:
            return "state"
        return ", ".join(n for n, a, b in zip(names, old, new, strict=True) if a != b)


def describe_failure(exc: BaseException) -> str:
    """The first error of a failed capture, then the last: ending a broken capture raises
    its own error ("operation failed due to a previous error during capture"), which would
    otherwise hide the operation that broke it."""

    def line(e: BaseException) -> str:
        text = str(e).strip()
        return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"

    root = exc
    while root.__context__ is not None and root.__context__ is not exc:
        root = root.__context__
    return line(exc) if root is exc else f"{line(root)} (then {line(exc)})"
