"""A recording gives the eager passes' cached blocks back before it captures: the graphs
allocate from their own pool, so blocks cached by the batches before the recording and by its
warm-up passes would otherwise stay reserved beside the pool for the whole run. GPU only: CUDA
graphs need a GPU."""

from __future__ import annotations

import pytest
import torch

from falconet_graphs_cuda.recording import capturing

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU"),
]

MIB = 1 << 20


def test_a_capture_gives_back_the_blocks_eager_passes_cached_on_each_stream():
    device = torch.device("cuda")
    side = torch.cuda.Stream(device)
    torch.cuda.empty_cache()
    held = torch.cuda.memory_reserved(device)
    for stream in (torch.cuda.current_stream(device), side):  # a batch's, a warm-up's
        with torch.cuda.stream(stream):
            activations = torch.ones(256 * MIB, dtype=torch.uint8, device=device)
            del activations  # cached for its stream, reserved
    side.wait_stream(torch.cuda.current_stream(device))
    assert torch.cuda.memory_reserved(device) >= held + 512 * MIB

    source = torch.arange(1024, dtype=torch.float32, device=device)
    graph = torch.cuda.CUDAGraph()
    with capturing(graph, torch.cuda.graph_pool_handle(), side):
        doubled = source * 2
    graph.replay()
    torch.cuda.synchronize(device)

    assert torch.cuda.memory_reserved(device) < held + 64 * MIB  # the pool's segment, no more
    assert torch.equal(doubled, source * 2)
