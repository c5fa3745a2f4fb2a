"""The GPU augmentation's render as one Triton kernel: a batch of plans in one launch.

:func:`falconet.data.gpu_augment.render` written in torch operations is the reference (it
runs on any device, and the CPU tests compare it with OpenCV); on a GPU it costs ~50 full-size
float passes over the batch (four masked images, four ``grid_sample`` calls, the colour
conversions), a memory traffic that costs the training step more time than the step has
to give. This kernel does the same arithmetic per output pixel in registers: the pixel
mapped back to its canvas by the plan's inverse matrix, each of its four bilinear neighbours
read from the tile that holds it (grey outside every tile), rounded, through OpenCV's 8-bit
HSV and the plan's lookup tables and back, written once as uint8 channels-last. It reads
three bytes per neighbour and writes three per pixel.

The rounding is :mod:`falconet.data.gpu_augment`'s (half up); the two agree to rounding
of single levels where float operations are ordered differently (a CPU test bounds the
difference with the kernel run in Triton's interpreter; tools/bench_data.py --gpu reports it
for the compiled kernel on a GPU).
"""

from __future__ import annotations

import importlib.util
from functools import cache

import torch

BLOCK = 512
"""Output pixels per program."""


@cache
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None  # found, not imported


def available(device: torch.device) -> bool:
    """Whether the fused kernel can render on ``device`` (Triton is installed: not on macOS,
    where the torch reference renders)."""
    return device.type == "cuda" and _has_triton()


def render_fused(
    pixels: torch.Tensor,
    tiles: torch.Tensor,
    inverse: torch.Tensor,
    tables: torch.Tensor,
    size: int,
    grey: int,
) -> torch.Tensor:
    """``[B, 3, size, size]`` uint8 channels_last from the store's ``pixels [n, S, S, 3]`` and
    the plans' ``tiles [B, 4, 7]``, ``inverse [B, 2, 3]``, ``tables [B, 3, 256]``."""
    from falconet.data.gpu_render_kernels import render

    batch = tiles.shape[0]
    out = torch.empty(batch, size, size, 3, dtype=torch.uint8, device=pixels.device)
    if batch:
        grid = (-(-size * size // BLOCK), batch)
        render[grid](
            pixels,
            tiles.contiguous(),
            inverse.float().contiguous(),
            tables.contiguous(),
            out,
            size,
            pixels.shape[1],
            float(grey),
            BLOCK=BLOCK,
        )
    return out.permute(0, 3, 1, 2)  # NHWC memory: the channels_last view
