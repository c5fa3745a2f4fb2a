"""A recording that fails leaves the run able to go on eagerly, random draws included (DETR's
denoising queries draw in every step). GPU only: CUDA graphs need a GPU."""

from __future__ import annotations

import pytest
import torch

from falconet_graphs_cuda.recording import reset_generator_capture

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU"),
]


def test_random_draws_work_after_a_capture_that_failed():
    device = torch.device("cuda")
    graph = torch.cuda.CUDAGraph()
    with (
        pytest.raises(Exception, match="captur"),
        torch.cuda.graph(graph, capture_error_mode="thread_local"),
    ):
        torch.rand(16, device=device)
        torch.zeros(1, device=device).item()  # a host sync: not permitted while capturing
    reset_generator_capture(device)
    drawn = torch.rand(16, device=device)
    assert drawn.shape == (16,) and bool(((drawn >= 0) & (drawn < 1)).all())
    again = torch.cuda.CUDAGraph()  # and a later recording with a draw still works
    with torch.cuda.graph(again):
        out = torch.rand(16, device=device)
    again.replay()
    assert bool(((out >= 0) & (out < 1)).all())
