"""falconet plugin: the ``cuda-graph`` and ``whole-step`` graph backends, their keys and the
profiler's levers for them (torch is imported only when a backend is used)."""

from __future__ import annotations

from falconet.registry import Register


def register_graph_backends(register: Register) -> None:
    from falconet_graphs_cuda.backend import CudaGraphBackend, WholeStepBackend

    register(CudaGraphBackend())
    register(WholeStepBackend())


def register_train_keys(register: Register) -> None:
    from falconet_graphs_cuda.keys import GRAPHS_CUDA_KEYS

    register(GRAPHS_CUDA_KEYS)


def register_levers(register: Register) -> None:
    from falconet_graphs_cuda.levers import LEVERS

    for lever in LEVERS:
        register(lever)
