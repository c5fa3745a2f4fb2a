"""falconet plugin: the ``cuda-graph`` graph backend. Torch is imported only when it is used."""

from __future__ import annotations

from falconet.registry import Register


def register_graph_backends(register: Register) -> None:
    from falconet_graphs_cuda.backend import CudaGraphDispatch

    register(CudaGraphDispatch())
