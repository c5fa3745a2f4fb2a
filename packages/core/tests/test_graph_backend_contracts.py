"""falconet-testing's graph-backend contract for the core's ``eager`` and ``compile``."""

from __future__ import annotations

from falconet.graph_backends.compile import CompileBackend
from falconet.graph_backends.eager import EagerBackend
from falconet_testing.contracts import GraphBackendContract


class TestEagerContract(GraphBackendContract):
    backend = EagerBackend()


class TestCompileContract(GraphBackendContract):
    """Inductor's kernels round differently from eager: close, not bit for bit."""

    backend = CompileBackend()
    exact = False
