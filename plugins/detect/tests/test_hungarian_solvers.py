"""The hungarian assigner's two solvers give the same matching: scipy image by image from one
host copy, and the batched solver on the device (padded slots, unassigned rows, NaN costs)."""

from __future__ import annotations

from dataclasses import astuple

import pytest
import torch
from torch_linear_assignment import batch_linear_assignment

from falconet.contract import Predictions
from falconet_detect.assigners import HUNGARIAN, SIMOTA, TAL
from falconet_detect.assigners.gpu_solver import gpu_solver, match_on_device
from falconet_detect.assigners.hungarian import HungarianAssigner, match_on_host
from falconet_testing.contracts.assigner import assigner_inputs


def costs(batch: int, slots: int, anchors: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, slots, anchors, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("slots", "anchors", "counts"),
    [
        (6, 64, [3, 0, 6]),  # padded slots, an image with no box, a full one
        (9, 300, [9, 1, 4]),  # DETR-like: many more queries than boxes
        (8, 5, [8, 2, 5]),  # more boxes than anchors: some boxes get none
    ],
)
def test_the_device_matching_is_the_host_matching(slots, anchors, counts):
    """The device glue (padding costs, the spare column, the scatter), driven by the library's
    public solver (scipy on CPU tensors; its Triton one has the same contract), against scipy
    per image."""
    for seed in range(4):
        cost = costs(len(counts), slots, anchors, seed)
        counts_t = torch.tensor(counts)
        owner, foreground = match_on_device(cost, counts_t, batch_linear_assignment)
        want_owner, want_foreground = match_on_host(cost, counts_t)
        assert torch.equal(foreground, want_foreground)
        assert torch.equal(owner * foreground.long(), want_owner * want_foreground.long())
        assert foreground.sum(1).tolist() == [min(c, anchors) for c in counts]


def test_nan_and_infinite_costs_match_instead_of_failing():
    cost = costs(2, 4, 16, 0)
    cost[0, 1] = float("nan")  # a diverged prediction for box 1 of image 0
    cost[1, 0, :8] = float("inf")
    counts = torch.tensor([4, 3])
    owner, foreground = match_on_device(cost, counts, batch_linear_assignment)
    assert foreground.sum(1).tolist() == [4, 3]
    assert sorted(owner[0][foreground[0] > 0].tolist()) == [0, 1, 2, 3]
    assert 0 in owner[1][foreground[1] > 0].tolist()  # box 0 still gets an anchor


def test_no_box_and_no_slot_batches_give_no_foreground():
    owner, foreground = match_on_device(costs(2, 0, 16, 0), torch.tensor([0, 0]), None)
    assert owner.shape == foreground.shape == (2, 16) and not foreground.any()


def test_on_the_cpu_the_assigner_solves_with_scipy_and_declares_a_sync():
    """Off the GPU the step synchronises once for the matching, so it is not static there."""
    cpu = torch.device("cpu")
    assert not HUNGARIAN.static_on(cpu) and TAL.static_on(cpu) and not SIMOTA.static_on(cpu)
    if torch.cuda.is_available():
        pytest.skip("the CPU machine's declaration for a CUDA device")
    assert gpu_solver() is None and not HUNGARIAN.static_on(torch.device("cuda"))


needs_gpu_solver = pytest.mark.skipif(
    not torch.cuda.is_available() or gpu_solver() is None,
    reason="needs a CUDA GPU of compute capability 8.0+ with Triton (torch-linear-assignment)",
)


@pytest.mark.gpu
@needs_gpu_solver
def test_on_the_gpu_the_assignment_is_scipys_and_reads_nothing_back():
    """The Triton solver's assignment equals scipy's, with no synchronisation in the call (sync
    debug mode raises on one) and recordable in a CUDA graph."""
    device = torch.device("cuda")
    for seed in range(3):
        predictions, targets = assigner_inputs(seed)
        want = HungarianAssigner()(predictions, targets)  # the CPU path: scipy
        predictions = Predictions(*(t.to(device) for t in astuple(predictions)))
        targets = targets.to(device)
        HUNGARIAN(predictions, targets)  # the solver compiled before the checked call
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = HUNGARIAN(predictions, targets)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.equal(got.foreground.cpu(), want.foreground)
        assert torch.equal(got.boxes.cpu(), want.boxes)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recorded = HUNGARIAN(predictions, targets)
    graph.replay()
    assert torch.equal(recorded.foreground, got.foreground)
    assert HUNGARIAN.static_on(device)
    assert not HungarianAssigner(on_gpu=False).static_on(device)
