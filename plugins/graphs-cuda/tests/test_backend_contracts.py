"""falconet-testing's graph-backend contract for ``cuda-graph`` and ``whole-step``.

On a CUDA device both run as they do in training. On the CPU ``cuda-graph`` declines (its
training tests skip with the reason) and ``whole-step`` runs its logic on a stand-in recorder
that replays the static step's functions eagerly on the same static buffers
(:class:`~falconet_graphs_cuda.recording.EagerStepRecorder`).
"""

from __future__ import annotations

import torch

from falconet_graphs_cuda.backend import CudaGraphBackend, WholeStepBackend
from falconet_graphs_cuda.keys import GraphsCudaKeys
from falconet_graphs_cuda.recording import EagerStepRecorder
from falconet_graphs_cuda.whole_step import WholeStep
from falconet_testing.contracts import GraphBackendContract

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class TestCudaGraphContract(GraphBackendContract):
    backend = CudaGraphBackend()
    device = DEVICE


class TestWholeStepContract(GraphBackendContract):
    backend = WholeStepBackend()
    device = DEVICE

    def build_step(self, parts, context):
        if DEVICE == "cuda":
            return super().build_step(parts, context)
        return WholeStep(parts, context.keys(GraphsCudaKeys), EagerStepRecorder())

    def _declined(self, parts):
        if DEVICE == "cuda":
            super()._declined(parts)  # on the CPU the stand-in recorder runs its logic

    def test_the_contract_run_is_replayed(self):
        """The contract's batches repeat one key, so most of them are replays, not the
        eager fallback: the comparison above is of the recorded step (its one key's bucket
        and, recorded ahead with it, the bucket above)."""
        from falconet_testing.contracts.graph_backend import (
            BATCHES,
            sample_batches,
            sample_parts,
            train_batches,
        )

        parts = sample_parts(DEVICE)
        step = self.build_step(parts, self.context(parts))
        train_batches(step, sample_batches(DEVICE))
        stats = step.stats()
        assert stats.recorded == 2 and stats.failed == 0 and not stats.pending
        assert stats.replayed >= BATCHES - 4
