"""Kernel time of a piece of GPU work without its launch cost: ``fn`` recorded once as a CUDA
graph (after warm-up calls on a side stream, as capture needs) and its replays timed, which is
how ``graph=whole-step`` runs it. Shared by the kernel benchmarks under ``tools/``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

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


def kernel_parser(doc: str) -> argparse.ArgumentParser:
    """The kernel benchmarks' common options: the network and its input, the batch sizes,
    the replays' warm-up and count, and the output file."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", default="yolo-n")
    parser.add_argument("--batch", default="16,64")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path)
    return parser


def kernel_report(args: argparse.Namespace, **extra: object) -> dict:
    """A kernel benchmark's report: versions, the GPU, the network, then ``extra`` (where its
    results go)."""
    return {
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(),
        "model": args.model,
        "imgsz": args.imgsz,
        **extra,
    }
