"""falconet plugin: the ``cuda-graph`` and ``whole-step`` graph backends (torch is imported
only when one is used)."""

from __future__ import annotations

from falconet.registry import Register


def register_graph_backends(register: Register) -> None:
    from falconet_graphs_cuda.backend import CudaGraphDispatch, WholeStepDispatch

    register(CudaGraphDispatch())
    register(WholeStepDispatch())
