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
import logging
import threading
from functools import cache

import torch

log = logging.getLogger("falconet.data")

BLOCK = 256
"""Output pixels per program."""

NUM_WARPS = 8
"""Warps per program: with :data:`BLOCK`, one pixel per thread. The fastest of seven launch
shapes on the H200 (tools/bench_data.py --render-configs; docs/gpu-data.md)."""


LAUNCH_BYTES = 2**31
"""Output bytes one launch may write: the kernel addresses its output in int32 (``(batch x
size x size + pixel) x 3``), so a larger batch is rendered in several launches (a batch of
1,366 at 640 px, of 342 at 1,280)."""

FP_FUSION = True
"""Triton's contraction of a multiply and an add into one FMA, named at every launch: the
kernel's rounding then does not move with Triton's default (on through 3.9, off from 3.10),
and its difference from the torch reference was measured with it on."""


@cache
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None  # found, not imported


def available(device: torch.device) -> bool:
    """Whether the fused kernel can render on ``device`` (Triton is installed: not on macOS,
    where the torch reference renders)."""
    return device.type == "cuda" and _has_triton()


_compiling: threading.Thread | None = None
"""The thread of :func:`compile_in_background`, until a render has waited for it."""


def compile_in_background(device: torch.device, size: int) -> None:
    """Compile the kernel for a run's ``size`` (and a store of that size) on a thread of its
    own, while the run starts up (the GPU cache fills, the network is built): the first batch
    then finds it compiled. The compilation begins with Triton hashing its own files to key
    its cache, a fixed cost in every process, on or off the disk cache; the hashing and the
    file reads release the GIL."""
    global _compiling
    if not available(device) or _compiling is not None:
        return
    from falconet.data.gpu_render_kernels import render  # imported here, on the caller's thread

    def compile_() -> None:
        try:
            with torch.cuda.device(device):
                # the arguments' types, and the sizes themselves (Triton specialises an
                # integer on its divisibility by 16): the key the first render looks up
                render.warmup(
                    torch.uint8,  # pixels
                    torch.int64,  # tiles
                    torch.float32,  # inverse
                    torch.uint8,  # tables
                    torch.uint8,  # out
                    size,
                    size,  # the store's slot: the run's size (gpu_cache.fill_store)
                    0.0,  # grey
                    BLOCK=BLOCK,
                    num_warps=NUM_WARPS,
                    enable_fp_fusion=FP_FUSION,  # as the launch: the key it looks up
                    grid=(1, 1),
                )
        except Exception as exc:  # the first render compiles instead, and raises what fails
            log.debug("the render kernel did not compile ahead of the first batch: %s", exc)

    _compiling = threading.Thread(target=compile_, name="falconet-render-compile", daemon=True)
    _compiling.start()


def _wait_for_compilation() -> None:
    global _compiling
    if _compiling is not None:
        _compiling.join()
        _compiling = None


def render_fused(
    pixels: torch.Tensor,
    tiles: torch.Tensor,
    inverse: torch.Tensor,
    tables: torch.Tensor,
    size: int,
    grey: int,
    *,
    block: int = BLOCK,
    num_warps: int = NUM_WARPS,
) -> torch.Tensor:
    """``[B, 3, size, size]`` uint8 channels_last from the store's ``pixels [n, S, S, 3]`` and
    the plans' ``tiles [B, 4, 7]``, ``inverse [B, 2, 3]``, ``tables [B, 3, 256]``; ``block``
    and ``num_warps``, the launch's shape, for tools/bench_data.py's comparison of them."""
    from falconet.data.gpu_render_kernels import render

    _wait_for_compilation()  # one compilation, not two at once
    batch = tiles.shape[0]
    out = torch.empty(batch, size, size, 3, dtype=torch.uint8, device=pixels.device)
    tiles, inverse, tables = tiles.contiguous(), inverse.float().contiguous(), tables.contiguous()
    per_launch = max(1, (LAUNCH_BYTES - 1) // (size * size * 3))  # one launch below 2**31 bytes
    for start in range(0, batch, per_launch):
        end = min(start + per_launch, batch)
        render[(-(-size * size // block), end - start)](
            pixels,
            tiles[start:end],
            inverse[start:end],
            tables[start:end],
            out[start:end],
            size,
            pixels.shape[1],
            float(grey),
            BLOCK=block,
            num_warps=num_warps,
            enable_fp_fusion=FP_FUSION,
        )
    return out.permute(0, 3, 1, 2)  # NHWC memory: the channels_last view
