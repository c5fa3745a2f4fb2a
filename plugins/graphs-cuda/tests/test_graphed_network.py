"""The decision logic of graph=cuda-graph on the CPU: counting, replay, retirement, fallback and
the gradient-accumulation copy.

CUDA graphs need a GPU; these tests drive :class:`GraphedNetwork` with
:class:`~falconet_graphs_cuda.recording.BufferRecorder`,
which keeps what matters of a CUDA-graph recording: static input, output and gradient buffers
that every replay overwrites in place. So the failure the accumulation copy prevents (a second
replay overwriting the gradient autograd stored from the first) really happens here without
the copy. The GPU side is checked by tools/check_graphs.py on the GPU machine.
"""

from __future__ import annotations

import logging
import re
import time

import pytest
import torch
from torch import nn

from falconet.contract import GraphContext
from falconet.precision import BF16, FP32
from falconet_graphs_cuda.backend import CudaGraphBackend
from falconet_graphs_cuda.graphed import GraphedNetwork, grad_buffer
from falconet_graphs_cuda.recording import BufferRecorder


class Net(nn.Module):
    """Conv + BatchNorm + a head with a non-differentiable extra output, like the YOLO head's
    anchor grid."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 2)
        self.unused = nn.Linear(2, 2)  # no gradient: the recording's grad is None-like

    def forward(self, x):
        y = self.bn(self.conv(x)).relu().mean((2, 3))
        return {"out": self.head(y), "grid": torch.arange(x.shape[0], dtype=torch.float32)}


def make(seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    net = Net().train()
    recorder = BufferRecorder(**kwargs)
    return net, recorder, GraphedNetwork(net, recorder)


def loss_of(out) -> torch.Tensor:
    return (out["out"] ** 2).sum()


def batch(seed: int, n: int = 4) -> torch.Tensor:
    return torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def test_a_shape_is_recorded_on_its_third_call_and_replayed_after() -> None:
    _net, recorder, graphed = make()
    for i in range(5):
        loss_of(graphed(batch(i))).backward()
    assert graphed.counts == {"replayed": 3, "eager": 2, "recorded": 1, "retired": 0, "failed": 0}
    assert recorder.recordings[0].replays == 3
    # a partial last batch, seen twice, stays eager and is not recorded
    for i in range(2):
        graphed(batch(10 + i, n=3))
    assert graphed.counts["recorded"] == 1 and graphed.counts["eager"] == 4


def test_recording_time_is_counted_and_logged(caplog) -> None:
    """The host time of each recording adds to ``capture_seconds`` and is in its log line:
    what a run spent recording, so a short run's lower rate can be put down to it."""

    class SlowRecorder(BufferRecorder):
        def __call__(self, *args, **kwargs):
            time.sleep(0.05)
            return super().__call__(*args, **kwargs)

    torch.manual_seed(0)
    graphed = GraphedNetwork(Net().train(), SlowRecorder())
    assert graphed.capture_seconds == 0.0
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        for i in range(3):
            loss_of(graphed(batch(i))).backward()
    assert graphed.counts["recorded"] == 1 and graphed.capture_seconds >= 0.05
    assert re.search(
        r"captured forward and backward for input \[4, 3, 8, 8\] in \d+ ms", caplog.text
    )


def test_replays_match_the_eager_network() -> None:
    """Same outputs, gradients and BatchNorm statistics, step after step."""
    eager_net, _, _ = make(seed=1)
    net, _, graphed = make(seed=1)
    for i in range(6):
        for _module, call in ((eager_net, eager_net), (net, graphed)):
            out = call(batch(i))
            loss_of(out).backward()
            assert torch.equal(out["grid"], torch.arange(4, dtype=torch.float32))
        for a, b in zip(eager_net.parameters(), net.parameters(), strict=True):
            assert (a.grad is None) == (b.grad is None)
            if a.grad is not None:
                torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
                a.grad = b.grad = None
        for a, b in zip(eager_net.buffers(), net.buffers(), strict=True):
            assert torch.equal(a, b)
    assert graphed.counts["replayed"] == 4


def accumulate(graphed: GraphedNetwork, net: nn.Module) -> list[torch.Tensor]:
    """Two microbatches into the same .grad, from ``grad=None`` (the trainer's zero_grad)."""
    for p in net.parameters():
        p.grad = None
    loss_of(graphed(batch(100))).backward()
    loss_of(graphed(batch(101))).backward()
    return [p.grad.clone() for p in net.parameters() if p.grad is not None]


def test_gradient_accumulation_sums_the_microbatches() -> None:
    eager_net, _, _ = make(seed=2)
    reference = accumulate(eager_net, eager_net)
    net, _, graphed = make(seed=2)
    for i in range(3):  # record the shape first
        graphed(batch(i))
    with torch.no_grad():
        for a, b in zip(eager_net.buffers(), net.buffers(), strict=True):
            b.copy_(a)  # same statistics before the microbatches (eager_net saw two batches)
    got = accumulate(graphed, net)
    assert graphed.counts["replayed"] >= 2
    for a, b in zip(reference, got, strict=True):
        torch.testing.assert_close(a, b)


class ChannelsLastHead(nn.Module):
    """A channels-last output, as the YOLO head's: the loss reads it through a view and a
    concatenation, so the gradient it sends back is a strided slice, not channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 1).to(memory_format=torch.channels_last)

    def forward(self, x):
        return [self.conv(x.contiguous(memory_format=torch.channels_last))]


def sliced_loss(outputs) -> torch.Tensor:
    (out,) = outputs
    flat = torch.cat([out.flatten(2), torch.zeros_like(out.flatten(2))], 2)
    return (flat**2).sum()


def test_the_gradient_buffers_take_the_layout_the_loss_sent_back() -> None:
    """The recording's output-gradient buffer has the strides the eager calls' gradients had
    (on the GPU, another layout sums the conv bias gradient in another order)."""
    torch.manual_seed(3)
    recorder = BufferRecorder()
    graphed = GraphedNetwork(ChannelsLastHead().train(), recorder)
    seen = []
    for i in range(4):
        outputs = graphed(batch(i))
        if i == 0:
            outputs[0].register_hook(lambda g: seen.append(g.stride()))
        sliced_loss(outputs).backward()
    assert graphed.counts["recorded"] == 1 and graphed.counts["replayed"] == 2
    (buffer,) = recorder.recordings[0].grad_outputs
    assert buffer.stride() == seen[0]
    assert buffer.stride() != outputs[0].stride()  # not the output's channels-last layout


@pytest.mark.parametrize(
    "shape, stride, expected",
    [
        ((2, 5, 4, 4), (160, 16, 4, 1), (160, 16, 4, 1)),  # a slice: gaps, no overlap
        ((2, 5, 4, 4), (80, 1, 20, 5), (80, 1, 20, 5)),  # channels-last
        ((2, 5, 4, 4), (0, 0, 0, 0), "output"),  # expanded from a scalar: overlaps
        ((2, 5, 4, 4), (80, 16, 2, 1), "output"),  # rows overlap
        ((2, 5, 4, 4), None, "output"),  # no eager gradient seen
    ],
)
def test_grad_buffer_keeps_only_layouts_a_buffer_can_have(shape, stride, expected) -> None:
    output = torch.empty(shape).to(memory_format=torch.channels_last)
    buffer = grad_buffer(output, stride)
    assert buffer.shape == output.shape
    assert buffer.stride() == (output.stride() if expected == "output" else expected)


class NoCopy(GraphedNetwork):
    def _unalias(self, recording) -> None:  # the bug the copy prevents
        pass


def test_without_the_copy_the_second_microbatch_overwrites_the_first() -> None:
    """The failure mode is real with these buffers: g0 + g1 becomes 2 x g1."""
    torch.manual_seed(2)
    net = Net().train()
    graphed = NoCopy(net, BufferRecorder())
    for i in range(3):
        graphed(batch(i))
    for p in net.parameters():
        p.grad = None
    loss_of(graphed(batch(100))).backward()
    loss_of(graphed(batch(101))).backward()
    twice_g1 = net.head.weight.grad.clone()
    for p in net.parameters():
        p.grad = None
    loss_of(graphed(batch(101))).backward()
    g1 = net.head.weight.grad.clone()
    torch.testing.assert_close(twice_g1, 2 * g1)


@pytest.mark.parametrize(
    "change, reason",
    [
        (
            lambda net: setattr(net.head, "weight", nn.Parameter(net.head.weight.clone())),
            "parameters",
        ),
        (lambda net: net.conv.register_forward_hook(lambda *a: None), "hooks"),
        (lambda net: net.eval(), "train/eval mode"),
    ],
    ids=["new-parameter", "hook", "eval-mode"],
)
def test_a_state_change_retires_every_recording(change, reason, caplog) -> None:
    net, _, graphed = make()
    for i in range(4):
        graphed(batch(i))
    assert graphed.recordings
    change(net)
    with caplog.at_level(logging.INFO, "falconet.train"):
        graphed(batch(9))
    assert not graphed.recordings and graphed.counts["retired"] == 1
    assert reason in caplog.text


def test_moved_parameter_storage_retires() -> None:
    net, _, graphed = make()
    for i in range(4):
        graphed(batch(i))
    with torch.no_grad():
        net.head.weight.data = net.head.weight.data.clone()  # what .to() or .half() does
    graphed(batch(9))
    assert graphed.counts["retired"] == 1 and graphed.counts["eager"] == 3


def test_a_precision_change_retires() -> None:
    _net, _, graphed = make()
    for i in range(4):
        graphed(batch(i))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        graphed(batch(9))
    assert graphed.counts["retired"] == 1 and not graphed.recordings


def test_no_grad_calls_run_eager_and_are_not_counted() -> None:
    _net, _, graphed = make()
    with torch.no_grad():
        for i in range(5):
            graphed(batch(i))
    assert graphed.counts["eager"] == 5 and not graphed.seen


def test_a_failed_capture_runs_that_shape_eager_and_logs_once(caplog) -> None:
    eager_net, _, _ = make(seed=3)
    _net, _, graphed = make(seed=3, fail=True)
    with caplog.at_level(logging.ERROR, "falconet.train"):
        for i in range(6):
            a, b = eager_net(batch(i)), graphed(batch(i))
            torch.testing.assert_close(a["out"], b["out"], rtol=0, atol=0)
    assert graphed.counts["failed"] == 1 and graphed.counts["eager"] == 6
    assert caplog.text.count("could not capture") == 1
    assert (  # the first error is named, not only the one ending the capture raised
        "RuntimeError: CUDA error: operation not permitted when stream is capturing (then "
        "RuntimeError: CUDA error: operation failed due to a previous error)" in caplog.text
    )


def test_the_backend_declines_where_it_cannot_run() -> None:
    backend = CudaGraphBackend()
    net = Net()
    cpu = GraphContext(torch.device("cpu"), FP32, capture_region=net)
    assert "CUDA device" in backend.decline_reason(cpu)
    cuda = torch.device("cuda", 0)
    assert "capture region" in backend.decline_reason(GraphContext(cuda, BF16, 1, None))
    assert backend.decline_reason(GraphContext(cuda, BF16, 1, net)) is None
    # under DDP the graphed network runs through DDP's wrapper, which all-reduces its gradients
    assert backend.decline_reason(GraphContext(cuda, BF16, 2, net)) is None


def test_both_backends_decline_grad_checkpoint_in_one_line() -> None:
    from falconet.grad_checkpoint import GradCheckpointKeys
    from falconet_graphs_cuda.backend import WholeStepBackend

    cuda, net = torch.device("cuda", 0), Net()
    for value in ("backbone", "backbone+neck"):
        context = GraphContext(cuda, BF16, 1, net, config=GradCheckpointKeys(grad_checkpoint=value))
        for backend in (CudaGraphBackend(), WholeStepBackend()):
            reason = backend.decline_reason(context)
            assert reason.startswith("grad_checkpoint recomputes blocks") and "\n" not in reason
    off = GraphContext(cuda, BF16, 1, net, config=GradCheckpointKeys())
    assert CudaGraphBackend().decline_reason(off) is None
