"""How the fused BatchNorm-SiLU op cuts an activation into its kernels' launches.

:class:`Tiling` holds the choices a sweep tunes (tiles, warps, programs per SM), with the
best of ``tools/bench_bn_silu.py --sweep`` as defaults and :func:`tiling_from_env` to set
any of them from the environment; :func:`plan_launch` turns a tiling and an activation's
shape into each kernel's grid and launch settings (:class:`Plan`), which
:mod:`falconet_graphs_cuda.bn_silu` launches and ``tools/bn_silu_registers.py`` compiles.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

import torch

FP_FUSION = True
"""Triton's contraction of a multiply and an add into one FMA, named at every launch: the
kernels' rounding then does not move with Triton's default (on through 3.9, off from 3.10),
and the equality checks of the op were measured with it on."""


@dataclass(frozen=True)
class Tiling:
    """How the kernels cut an activation: the elementwise kernels' tile (elements) and warps,
    the reductions' tile and warps, and how many row programs a reduction aims at per SM
    (spread over its channel blocks). ``tools/bench_bn_silu.py --sweep`` times the choices.

    ``merge_elements``, ``merge_channels``: the merge kernels' tile, and the most channels
    one merge program takes. A merge runs one program per block of channels and waits on
    its loads, so narrower blocks give it more programs; each takes the partial results of
    ``merge_elements // its channels`` programs at a time (too large a tile makes the merge
    kernels spill registers: ``tools/bn_silu_registers.py`` says which tilings do, without a
    GPU)."""

    # the defaults are the best of tools/bench_bn_silu.py --sweep for yolo-n (docs/lab/)
    map_elements: int = 2048
    map_warps: int = 4
    reduce_elements: int = 8192
    reduce_warps: int = 4
    programs_per_sm: int = 4
    merge_elements: int = 4096
    merge_channels: int = 16


# each field's least value, and whether Triton needs it a power of two (its tiles and warps)
# (a tile spans 64 channels at most)
_FIELD_RULES = {
    "map_elements": (64, True), "reduce_elements": (64, True), "map_warps": (1, True),
    "reduce_warps": (1, True), "programs_per_sm": (1, False), "merge_elements": (64, True),
    "merge_channels": (16, True),
}  # fmt: skip


def tiling_from_env(environ: Mapping[str, str] = os.environ) -> Tiling:
    """The default tiling, any field set by ``FALCONET_BN_SILU_<FIELD>`` (for example
    ``FALCONET_BN_SILU_MAP_WARPS=8``): how ``tools/bench_train.py`` times another tiling in
    the whole step beside the default, and how to try one on another GPU."""
    values = {}
    for f in fields(Tiling):
        name = f"FALCONET_BN_SILU_{f.name.upper()}"
        if name not in environ:
            continue
        least, power = _FIELD_RULES[f.name]
        try:
            value = int(environ[name])
        except ValueError:
            raise ValueError(f"{name}={environ[name]!r}: give a whole number") from None
        if power and (value < least or value & (value - 1)):
            raise ValueError(
                f"{name}={value}: give a power of two of at least {least} (Triton's tiles "
                "and warps come in powers of two)"
            )
        if value < least:
            raise ValueError(f"{name}={value}: give a whole number of at least {least}")
        values[f.name] = value
    return Tiling(**values)


@functools.cache
def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 2  # Triton's interpreter on the CPU (the tests)
    return torch.cuda.get_device_properties(device).multi_processor_count


# the launch settings each kernel takes (Plan.meta); tools/bn_silu_registers.py compiles
# every kernel with them for a GPU that need not be present
KERNEL_KINDS = {
    "bn_silu_stats": "reduce", "bn_silu_grad_sums": "reduce", "bn_silu_stats_merge": "merge",
    "bn_silu_grad_merge": "merge", "bn_silu_normalise": "map", "bn_silu_input_grad": "map",
}  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """One activation's cut under ``tiling``: ``[rows, channels]`` in channel blocks of
    ``block_c``; elementwise row tiles of ``map_r``; reduction row tiles of ``reduce_r``,
    ``per_program`` rows (a whole number of tiles) to each of ``programs`` row programs;
    the merges take ``merge_c`` channels a program and the partial results of ``merge_p``
    programs at a time."""

    tiling: Tiling
    rows: int
    channels: int
    block_c: int
    map_r: int
    reduce_r: int
    per_program: int
    merge_c: int
    merge_p: int

    @property
    def channel_blocks(self) -> int:
        return -(-self.channels // self.block_c)

    @property
    def programs(self) -> int:
        return -(-self.rows // self.per_program)

    @property
    def merge_grid(self) -> tuple[int]:
        return (-(-self.channels // self.merge_c),)

    @property
    def reduce_grid(self) -> tuple[int, int]:
        return self.programs, self.channel_blocks

    @property
    def map_grid(self) -> tuple[int, int]:
        return -(-self.rows // self.map_r), self.channel_blocks

    def meta(self, kind: str) -> dict[str, int]:
        """The tiles, warps and :data:`FP_FUSION` of a kind of kernel (:data:`KERNEL_KINDS`)."""
        t = self.tiling
        if kind == "reduce":
            tiles = {"BLOCK_R": self.reduce_r, "BLOCK_C": self.block_c}
            warps = t.reduce_warps
        elif kind == "merge":
            tiles, warps = {"BLOCK_P": self.merge_p, "BLOCK_C": self.merge_c}, t.reduce_warps
        else:
            tiles, warps = {"BLOCK_R": self.map_r, "BLOCK_C": self.block_c}, t.map_warps
        return {**tiles, "num_warps": warps, "enable_fp_fusion": FP_FUSION}


def plan_launch(x: torch.Tensor, tiling: Tiling) -> Plan:
    """``x``'s cut under ``tiling``: channel blocks of the channels' next power of two (16 to
    64), and row programs spread so that each SM gets ``tiling.programs_per_sm``."""
    channels = x.shape[1]
    rows = x.numel() // channels
    block_c = min(64, max(16, 1 << (channels - 1).bit_length()))
    reduce_r = tiling.reduce_elements // block_c
    target = max(1, tiling.programs_per_sm * _sms(x.device) // -(-channels // block_c))
    per_program = reduce_r * math.ceil(math.ceil(rows / target) / reduce_r)
    merge_c = min(block_c, tiling.merge_channels)
    map_r, merge_p = tiling.map_elements // block_c, tiling.merge_elements // merge_c
    return Plan(tiling, rows, channels, block_c, map_r, reduce_r, per_program, merge_c, merge_p)
