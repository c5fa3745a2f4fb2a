"""Bit-for-bit comparison of checkpoints, for exact-resume tests."""

from __future__ import annotations

from typing import Any


def assert_same_tensors(a: Any, b: Any, where: str = "checkpoint") -> None:
    """Assert that ``a`` and ``b`` (nested dicts, lists and tuples of tensors and plain
    values, as ``last.pt`` holds) are equal: every tensor bit for bit and of the same dtype;
    ``where`` names the first entry that differs."""
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_tensors(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, where
