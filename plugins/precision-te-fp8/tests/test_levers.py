"""falconet-precision-te-fp8's lever: ``amp_dtype=fp8`` for a busy GPU in half precision."""

from __future__ import annotations

import pytest

from falconet.levers import LeverContext
from falconet_precision_te_fp8.levers import LEVERS, fp8
from falconet_testing.contracts import LeverContract

INSTALLED = frozenset({"fp32", "fp16", "bf16", "fp8"})


class TestFp8Lever(LeverContract):
    levers = LEVERS


@pytest.mark.parametrize(
    ("device", "precision", "suggested"),
    [
        ("cuda", "bf16", True),
        ("cuda", "fp16", True),
        ("cuda", "fp32", False),  # the core's lever moves it to bf16 first
        ("cuda", "fp8", False),
        ("cpu", "bf16", False),
    ],
)
def test_fp8_from_half_precision_on_a_gpu(device, precision, suggested):
    context = LeverContext(
        verdict="compute", device=device, precision=precision, precision_backends=INSTALLED
    )
    suggestion = fp8.suggest(context)
    assert (suggestion is not None) == suggested
    if suggested:
        assert (suggestion.key, suggestion.value) == ("amp_dtype", "fp8")
        assert "FP8 Tensor Cores" in suggestion.why
