"""Device parameters for tests that hold on the CPU and on a GPU alike."""

from __future__ import annotations

import pytest
import torch


def cpu_and_cuda(why_cuda: str) -> list:
    """``"cpu"`` and ``"cuda"`` for ``pytest.mark.parametrize("device", ...)``: the CUDA case
    skips where no GPU is visible, with ``why_cuda`` (what the GPU case exercises) as the
    reason, so the CPU run says what only the GPU machine checks."""
    return [
        "cpu",
        pytest.param(
            "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=why_cuda)
        ),
    ]
