"""tools/bn_silu_registers.py: the bn_silu kernels compile for Hopper (sm_90) on a machine
without a GPU, under the default tiling and a smaller merge tile, and what the cubins say:
the elementwise kernels and the reductions spill nothing, and at a 2,048-element merge tile
nothing does (at 8,192 the merge kernels spill: docs/performance.md). A compile
error that the CPU tests' interpreter cannot see (types, loops with runtime bounds) fails
here, not in GPU time."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="the kernels are Triton's")


@pytest.fixture(scope="module")
def registers(load_tool):
    return load_tool("bn_silu_registers")


def _by_kernel(rows) -> dict[str, dict]:
    return {row["kernel"]: row for row in rows}


def test_kernels_compile_for_hopper_and_spill_only_in_the_merges(registers):
    from falconet_graphs_cuda.bn_silu_tiling import KERNEL_KINDS, Tiling

    rows = _by_kernel(registers.table(Tiling(), "fp16", 90, widths=(64,)))
    assert set(rows) == set(KERNEL_KINDS)
    for name, row in rows.items():
        assert 0 < row["registers"] <= 255, name
        if KERNEL_KINDS[name] in ("map", "reduce"):
            assert row["stack"] == 0, (name, row)
    assert rows["bn_silu_normalise"]["num_warps"] == Tiling().map_warps
    merge_c = min(64, Tiling().merge_channels)
    assert rows["bn_silu_stats_merge"]["BLOCK_C"] == merge_c
    assert rows["bn_silu_stats_merge"]["BLOCK_P"] == Tiling().merge_elements // merge_c


def test_a_smaller_merge_tile_spills_nothing(registers):
    from falconet_graphs_cuda.bn_silu_tiling import Tiling

    rows = registers.table(Tiling(merge_elements=2048), "bf16", 90, widths=(64,))
    assert all(row["stack"] == 0 for row in rows), [r for r in rows if r["stack"]]
