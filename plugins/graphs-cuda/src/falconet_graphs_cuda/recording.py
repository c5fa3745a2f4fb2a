"""Record the network's forward and backward for one input shape as two CUDA graphs.

What a recording does, in order (the rules of docs/performance.md):

1. **Warm-up** (``warmup`` forward + backward passes on a side stream, as CUDA graphs require,
   so cuDNN picks its algorithms and lazy state is built outside the capture). Warm-up updates
   BatchNorm running statistics and may draw random numbers, so every buffer of the network and
   the CUDA RNG state are saved before and restored after: a run with graphs sees the same
   statistics as one without. Gradients are computed with ``torch.autograd.grad``, so no
   ``param.grad`` is touched.
2. **Capture** of the forward, then of the backward (``torch.autograd.grad`` of the
   differentiable outputs with respect to the parameters, fed by static ``grad_outputs``
   laid out as the loss's gradients were, :func:`~falconet_graphs_cuda.graphed.grad_buffer`),
   both into ``pool``, one memory pool shared by every recording of the run. Sharing is safe
   because a training step replays one recording's forward and backward back to back, and
   each recording keeps its static buffers alive, so what one recording reuses of another's
   pool is only that other recording's freed intermediates. Capture uses the thread-local
   error mode, so the data loader's pin-memory thread may keep calling CUDA meanwhile.
   Autocast runs with its weight-cast cache off while capturing (a cached cast made inside
   a capture would point into graph memory after it).

Warm-up and capture each call the network through :func:`torch.func.functional_call` with
their own fresh leaf tensors that share the parameters' storage (so replays read the weights
the optimizer updates in place). With the parameters themselves, autograd reuses each
parameter's gradient-accumulator node while a previous step's graph is still referenced (the
trainer holds the last loss), and that node keeps the stream it was made on (the default
one): the backward capture then made the legacy stream wait on the capturing one and failed,
on the H200, with "operation would make the legacy stream depend on a capturing blocking
stream" (PyTorch calls this a stale stream reference of a leaf; pytorch/pytorch#180090).
Leaves made inside the capture have their nodes made on the capture stream.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._pytree import tree_flatten

from falconet_graphs_cuda.graphed import GradStrides, grad_buffer

if TYPE_CHECKING:
    from falconet.data.targets import Targets


@dataclass
class CudaRecording:
    """Static buffers and the two graphs of one recorded input shape."""

    static_input: torch.Tensor
    outputs: list[torch.Tensor]
    differentiable: list[bool]
    spec: Any
    grad_outputs: list[torch.Tensor]
    grads: list[torch.Tensor | None]
    forward_graph: torch.cuda.CUDAGraph
    backward_graph: torch.cuda.CUDAGraph

    def forward(self) -> None:
        self.forward_graph.replay()

    def backward(self) -> None:
        self.backward_graph.replay()


class CudaRecorder:
    """``recorder(network, sample, params)`` for :class:`~falconet_graphs_cuda.graphed.
    GraphedNetwork`, with one memory pool for all its recordings."""

    def __init__(self, warmup: int = 3) -> None:
        self.warmup = warmup
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(
        self,
        network: nn.Module,
        sample: torch.Tensor,
        params: Sequence[nn.Parameter],
        grad_strides: GradStrides = None,
    ) -> CudaRecording:
        device_type = sample.device.type
        autocast = torch.autocast(
            device_type,
            dtype=torch.get_autocast_dtype(device_type),
            enabled=torch.is_autocast_enabled(device_type),
            cache_enabled=False,
        )
        static_input = torch.empty_like(sample).copy_(sample)
        names = [name for name, p in network.named_parameters() if p.requires_grad]

        def fresh_leaves() -> dict[str, torch.Tensor]:
            return {
                name: p.detach().requires_grad_() for name, p in zip(names, params, strict=True)
            }

        buffers = [b.detach().clone() for b in network.buffers()]
        rng = torch.cuda.get_rng_state(sample.device)
        try:
            side = torch.cuda.Stream(sample.device)
            side.wait_stream(torch.cuda.current_stream(sample.device))
            with torch.cuda.stream(side), autocast:
                leaves = fresh_leaves()
                for _ in range(self.warmup):
                    flat = tree_flatten(functional_call(network, leaves, (static_input,)))[0]
                    wanted = [o for o in flat if o.requires_grad]
                    torch.autograd.grad(
                        wanted,
                        list(leaves.values()),
                        [torch.ones_like(o) for o in wanted],
                        allow_unused=True,
                    )
                    del flat, wanted
            torch.cuda.current_stream(sample.device).wait_stream(side)

            forward_graph = torch.cuda.CUDAGraph()
            with (
                torch.cuda.graph(forward_graph, pool=self.pool, capture_error_mode="thread_local"),
                autocast,
            ):
                leaves = fresh_leaves()  # accumulator nodes made here, on the capture stream
                flat, spec = tree_flatten(functional_call(network, leaves, (static_input,)))
            differentiable = [o.requires_grad for o in flat]
            wanted = [o for o in flat if o.requires_grad]
            if grad_strides is None or len(grad_strides) != len(wanted):
                grad_strides = [None] * len(wanted)
            grad_outputs = [grad_buffer(o, s) for o, s in zip(wanted, grad_strides, strict=True)]
            backward_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(
                backward_graph, pool=self.pool, capture_error_mode="thread_local"
            ):
                grads = torch.autograd.grad(
                    wanted, list(leaves.values()), grad_outputs, allow_unused=True
                )
        finally:  # the warm-up's statistics and random draws are not the run's
            with torch.no_grad():
                for buffer, saved in zip(network.buffers(), buffers, strict=True):
                    buffer.copy_(saved)
            torch.cuda.set_rng_state(rng, sample.device)
        return CudaRecording(
            static_input=static_input,
            outputs=[o.detach() for o in flat],
            differentiable=differentiable,
            spec=spec,
            grad_outputs=grad_outputs,
            grads=list(grads),
            forward_graph=forward_graph,
            backward_graph=backward_graph,
        )


class CudaMicro:
    """One recorded forward + loss + backward of the whole step (static images and targets)."""

    def __init__(self, bucket: tuple[int, ...], images, targets, loss, parts, graph) -> None:
        self.bucket = bucket
        self.images, self.targets = images, targets
        self.loss, self.parts, self.graph = loss, parts, graph
        self.phases: dict[str, float] = {}  # host seconds of the recording's phases

    def replay(self, images: torch.Tensor, targets: Targets):
        self.images.copy_(images)
        copy_targets(self.targets, targets)
        self.graph.replay()
        return self.loss, self.parts


class CudaUpdate:
    def __init__(self, graph: torch.cuda.CUDAGraph) -> None:
        self.graph = graph

    def replay(self) -> None:
        self.graph.replay()


class CudaStepRecorder:
    """Records :class:`~falconet_graphs_cuda.static_step.StaticStep`'s two functions as CUDA
    graphs, with the rules of :class:`CudaRecorder` (side-stream warm-up, state restored after
    it, one shared pool, thread-local capture mode). The update's warm-up runs once on the real
    tensors and everything it changed (weights, momentum buffers, EMA, gradients, and in a
    distributed run the network's buffers) is restored."""

    def __init__(self, warmup: int = 3) -> None:
        self.warmup = warmup
        self.pool = torch.cuda.graph_pool_handle()
        self.side: torch.cuda.Stream | None = None  # warm-ups and captures, made at the first
        self.warmed: set[tuple] = set()  # image shapes a recording has warmed up at
        self.held: tuple | None = None  # the last recording's loss and parts (their shapes)

    def _side(self, device: torch.device) -> torch.cuda.Stream:
        if self.side is None:
            self.side = torch.cuda.Stream(device)
        self.side.wait_stream(torch.cuda.current_stream(device))
        return self.side

    def micro(
        self,
        step,
        images: torch.Tensor,
        targets: Targets,
        bucket: tuple[int, ...],
        *,
        trained: bool = False,
    ):
        """The forward + loss + backward of ``bucket`` recorded. Its warm-up runs ``warmup``
        passes at an image shape not recorded before and one at a shape that was (a new target
        bucket): the network's algorithms at that shape are chosen and its lazy state built,
        and one pass builds what the loss's new target shapes need. With ``trained`` (the
        step has already trained batches of exactly these shapes, eagerly, in this process)
        a new bucket at a recorded image shape needs no pass: those batches built what its
        loss needs. Should that capture fail all the same, it is recorded again after one
        pass, so skipping the pass never costs the run its recordings."""
        shape = (tuple(images.shape), images.stride(), images.dtype)
        if shape not in self.warmed:
            return self._record(step, images, targets, bucket, self.warmup)
        if trained and self.held is not None:
            # a capture that fails comes in many types; _record leaves the generator out of
            # capture mode, and the bucket is recorded again below, after one pass
            with contextlib.suppress(Exception):
                return self._record(step, images, targets, bucket, 0)
        return self._record(step, images, targets, bucket, 1)

    def _record(self, step, images: torch.Tensor, targets: Targets, bucket, passes: int):
        """:meth:`micro` after ``passes`` warm-up passes (none: the outputs' buffers are
        shaped as the last recording's)."""
        device = images.device
        static_images = images.clone()
        static_targets = clone_targets(targets)
        network = step.network
        buffers = [b.detach().clone() for b in network.buffers()]
        rng = torch.cuda.get_rng_state(device)
        shape = (tuple(images.shape), images.stride(), images.dtype)
        try:
            start = time.perf_counter()
            side = self._side(device)
            if passes:
                with torch.cuda.stream(side), _no_autocast_cache(device.type):
                    for _ in range(passes):
                        loss, parts = step.micro(static_images, static_targets, accumulate=False)
                torch.cuda.current_stream(device).wait_stream(side)
            else:
                loss, parts = self.held  # a loss and its parts are scalars at every bucket
            warmed = time.perf_counter()
            # the outputs a replay hands back, outside the graphs' shared pool: a bucket recorded
            # after the update is replayed before it, and the update's temporaries, freed into
            # the pool when it was recorded, may lie where this recording put its own outputs
            held_loss = torch.empty_like(loss)
            held_parts = {name: torch.empty_like(value) for name, value in parts.items()}
            graph = torch.cuda.CUDAGraph()
            with capturing(graph, self.pool, side), _no_autocast_cache(device.type):
                loss, parts = step.micro(static_images, static_targets)
                held_loss.copy_(loss)
                for name, value in parts.items():
                    held_parts[name].copy_(value)
            self.warmed.add(shape)
            captured = time.perf_counter()
        except BaseException:
            reset_generator_capture(device)
            raise
        finally:
            with torch.no_grad():
                for buffer, saved in zip(network.buffers(), buffers, strict=True):
                    buffer.copy_(saved)
            torch.cuda.set_rng_state(rng, device)
        self.held = (held_loss, held_parts)
        recording = CudaMicro(bucket, static_images, static_targets, held_loss, held_parts, graph)
        recording.phases = {f"warm-up ({passes})": warmed - start, "capture": captured - warmed}
        return recording

    def update(self, step) -> CudaUpdate:
        device = step.parts.device
        tensors = list(step.params) + list(step.grads)
        tensors += step.state_tensors() + step.scaler_tensors()
        floats, others = step.ema_tensors()
        tensors += floats[0] + others[0]
        tensors += step.buffers  # a distributed update gives them rank 0's values
        saved = [t.detach().clone() for t in tensors]
        try:
            side = self._side(device)
            with torch.cuda.stream(side):
                step.update()
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with capturing(graph, self.pool, side):
                step.update()
        finally:  # the warm-up's update is not the run's
            with torch.no_grad():
                for tensor, value in zip(tensors, saved, strict=True):
                    tensor.copy_(value)
        return CudaUpdate(graph)


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, pool, stream: torch.cuda.Stream):
    """``torch.cuda.graph``'s capture (into ``pool``, on ``stream``, thread-local error mode),
    after emptying torch's memory cache as it does, without its device synchronisation (the
    recorder's side stream already waits for the work queued before it, and a capture runs
    nothing itself) nor its emptying of the pinned host cache (the CPU loader's, which it
    would pin again).

    The cache is emptied because what it holds then is the eager passes' memory: the blocks of
    the batches trained before the step was recorded and of the warm-up passes, one set per
    stream they ran on. The graphs never use those blocks (a recording allocates from its own
    pool), and once the step replays an eager pass is rare (a batch whose target bucket is not
    recorded yet): kept, they would stand reserved beside the pool for the rest of the run
    (docs/performance.md, the recordings' memory). Emptying waits for the blocks' last uses on
    the device to end."""
    torch.cuda.empty_cache()
    with torch.cuda.stream(stream):
        graph.capture_begin(pool, capture_error_mode="thread_local")
        try:
            yield
        finally:
            graph.capture_end()


def reset_generator_capture(device: torch.device) -> None:
    """After a recording that failed, leave torch's CUDA generator out of capture mode.

    A capture that fails ends without its epilogue, and the generator then still counts its
    offsets for a graph: the next random draw outside a capture raises ("Offset increment
    outside graph capture"), which would end a run that should go on eagerly (DETR's
    denoising draws). One empty recording begins and ends a capture on the generator again.
    """
    with contextlib.suppress(RuntimeError):  # the failed capture's error, reported once
        torch.cuda.synchronize(device)
    with torch.cuda.device(device), torch.cuda.graph(torch.cuda.CUDAGraph()):
        pass


def _no_autocast_cache(device_type: str):
    """The trainer's autocast (entered inside ``micro``) with the weight-cast cache off: a
    nested context whose setting the inner one inherits."""

    @contextlib.contextmanager
    def off():
        previous = torch.is_autocast_cache_enabled()
        torch.set_autocast_cache_enabled(False)
        try:
            yield
        finally:
            torch.set_autocast_cache_enabled(previous)

    return off()


def clone_targets(targets: Targets) -> Targets:
    """Static copies of every tensor of ``targets`` (what a recording reads)."""
    names = [f.name for f in dataclasses.fields(targets)]
    return dataclasses.replace(targets, **{n: getattr(targets, n).clone() for n in names})


def copy_targets(static: Targets, targets: Targets) -> None:
    """Fill a recording's static targets with ``targets`` (of the same bucket)."""
    for field in dataclasses.fields(static):
        getattr(static, field.name).copy_(getattr(targets, field.name))


class EagerStepRecorder:
    """A stand-in for :class:`CudaStepRecorder` that "records" by keeping static copies of the
    inputs and "replays" by running the static step's functions eagerly on them: the buffer
    semantics of a replay without CUDA, so the whole step's logic runs on the CPU (the tests
    and falconet-testing's graph-backend contract). ``fail`` makes every recording raise, as
    a capture that fails does."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.micros: list[EagerMicro] = []
        self.trained: list[bool] = []  # each recording's ``trained``, as the step passed it

    def micro(
        self,
        step,
        images: torch.Tensor,
        targets: Targets,
        bucket: tuple[int, ...],
        *,
        trained: bool = False,
    ):
        self.trained.append(trained)
        if self.fail:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        self.micros.append(EagerMicro(step, bucket, images.clone(), clone_targets(targets)))
        return self.micros[-1]

    def update(self, step) -> EagerUpdate:
        return EagerUpdate(step)


class EagerMicro:
    """A "recorded" forward + loss + backward: the static step's ``micro`` on static inputs."""

    def __init__(self, step, bucket: tuple[int, ...], images: torch.Tensor, targets) -> None:
        self.step, self.bucket = step, bucket
        self.images, self.targets = images, targets
        self.replays = 0
        self.phases: dict[str, float] = {}

    def replay(self, images: torch.Tensor, targets: Targets):
        self.images.copy_(images)
        copy_targets(self.targets, targets)
        self.replays += 1
        return self.step.micro(self.images, self.targets)


class EagerUpdate:
    """A "recorded" update: the static step's ``update``."""

    def __init__(self, step) -> None:
        self.step = step

    def replay(self) -> None:
        self.step.update()


class BufferRecording:
    """A "recording" of the network whose replays run it eagerly but read and write only
    static buffers, in place, as a CUDA graph replay does."""

    def __init__(self, network: nn.Module, sample: torch.Tensor, params, grad_strides) -> None:
        self.network, self.params = network, list(params)
        self.static_input = sample.clone()
        saved = [b.clone() for b in network.buffers()]
        flat, self.spec = tree_flatten(network(self.static_input))
        self.differentiable = [o.requires_grad for o in flat]
        self.outputs = [o.detach().clone() for o in flat]
        wanted = [o for o in flat if o.requires_grad]
        strides = grad_strides or [None] * len(wanted)
        self.grad_outputs = [
            grad_buffer(o, st).fill_(1) for o, st in zip(wanted, strides, strict=True)
        ]
        used = torch.autograd.grad(wanted, self.params, self.grad_outputs, allow_unused=True)
        self.grads = [None if g is None else torch.zeros_like(g) for g in used]
        with torch.no_grad():  # like the CUDA recorder: recording leaves the statistics alone
            for buffer, value in zip(network.buffers(), saved, strict=True):
                buffer.copy_(value)
        self._live: list[torch.Tensor] = []
        self.replays = 0

    def forward(self) -> None:
        with torch.enable_grad():  # autograd.Function.forward runs without; a graph needs none
            flat = tree_flatten(self.network(self.static_input))[0]
        for static, out in zip(self.outputs, flat, strict=True):
            static.copy_(out.detach())
        self._live = [o for o in flat if o.requires_grad]
        self.replays += 1

    def backward(self) -> None:
        grads = torch.autograd.grad(self._live, self.params, self.grad_outputs, allow_unused=True)
        for static, grad in zip(self.grads, grads, strict=True):
            if static is not None:
                static.copy_(grad)


class BufferRecorder:
    """A stand-in for :class:`CudaRecorder` with a recording's buffer semantics and no CUDA, so
    :class:`~falconet_graphs_cuda.graphed.GraphedNetwork`'s logic runs on the CPU (the tests,
    and its distributed test on Gloo ranks). ``fail`` makes every recording raise as a capture
    that meets a host sync does."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.recordings: list[BufferRecording] = []

    def __call__(self, network, sample, params, grad_strides=None):
        if self.fail:  # what a capture that meets a host sync raises, then ending it
            try:
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
            finally:
                raise RuntimeError("CUDA error: operation failed due to a previous error")
        self.recordings.append(BufferRecording(network, sample, params, grad_strides))
        return self.recordings[-1]
