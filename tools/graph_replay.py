"""Kernel time of a piece of GPU work without its launch cost: ``fn`` recorded once as a CUDA
graph (after warm-up calls on a side stream, as capture needs) and its replays timed, which is
how ``graph=whole-step`` runs it. Shared by the kernel benchmarks under ``tools/``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from bench_train import median_ms  # CUDA events, warm-up left out, median


def replay_ms(fn: Callable[[], object], warmup: int = 5, repeats: int = 50) -> float:
    """Median milliseconds of one replay of ``fn``'s graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return median_ms(graph.replay, warmup, repeats)
