"""The Triton kernels of :mod:`falconet.data.gpu_render`, in a module of their own so that
Triton, slow to import, loads only when a GPU render runs."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _round(x):
    return tl.floor(x + 0.5)


@triton.jit
def _level(x):
    """Rounded and clamped to ``[0, 255]``."""
    return tl.minimum(tl.maximum(_round(x), 0.0), 255.0)


@triton.jit
def _neighbours(tiles, b, x0, y0, inside, slot):
    """Where the four bilinear neighbours ``(x0 + i, y0 + j)`` of each canvas point are in
    the store (byte offsets, ``i`` and ``j`` in 0 and 1), and whether a tile holds them (grey
    outside every tile; an absent tile, image ``-1``, has the empty rectangle ``[0, 0) x [0,
    0)``). Each tile's rectangle is read once, each coordinate compared once per tile, and
    the four offsets share one computation: the same arithmetic as one tap at a time did,
    with a quarter of its comparisons and multiplications."""
    empty = (x0 * 0).to(tl.int64)
    off00, off01, off10, off11 = empty, empty, empty, empty
    in00 = empty < 0
    in01, in10, in11 = in00, in00, in00
    for t in tl.static_range(4):
        tile = tiles + (b * 4 + t) * 7
        image = tl.load(tile)  # int64, as the plan's tiles; the coordinates fit in int32
        x1a, y1a = tl.load(tile + 1).to(tl.int32), tl.load(tile + 2).to(tl.int32)
        x2a, y2a = tl.load(tile + 3).to(tl.int32), tl.load(tile + 4).to(tl.int32)
        x1b, y1b = tl.load(tile + 5).to(tl.int32), tl.load(tile + 6).to(tl.int32)
        col0 = (x0 >= x1a) & (x0 < x2a)
        col1 = (x0 + 1 >= x1a) & (x0 + 1 < x2a)
        row0 = inside & (y0 >= y1a) & (y0 < y2a)
        row1 = inside & (y0 + 1 >= y1a) & (y0 + 1 < y2a)
        # the image's first byte in int64 (a large store passes 2**31 bytes), the rest in int32
        base = image.to(tl.int64) * slot * slot * 3
        at = base + (((y0 - y1a + y1b) * slot + x0 - x1a + x1b) * 3).to(tl.int64)
        down = slot * 3
        off00 = tl.where(row0 & col0, at, off00)
        off01 = tl.where(row0 & col1, at + 3, off01)
        off10 = tl.where(row1 & col0, at + down, off10)
        off11 = tl.where(row1 & col1, at + down + 3, off11)
        in00, in01 = in00 | (row0 & col0), in01 | (row0 & col1)
        in10, in11 = in10 | (row1 & col0), in11 | (row1 & col1)
    return off00, off01, off10, off11, in00, in01, in10, in11


@triton.jit
def _read(pixels, at, found, grey):
    """The three bytes at ``at`` where ``found``, grey elsewhere, as floats."""
    r = tl.where(found, tl.load(pixels + at, mask=found, other=0).to(tl.float32), grey)
    g = tl.where(found, tl.load(pixels + at + 1, mask=found, other=0).to(tl.float32), grey)
    bl = tl.where(found, tl.load(pixels + at + 2, mask=found, other=0).to(tl.float32), grey)
    return r, g, bl


@triton.jit
def render(pixels, tiles, inverse, tables, out, size, slot, grey, BLOCK: tl.constexpr):
    b = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < size * size
    ox = (offs % size).to(tl.float32)
    oy = (offs // size).to(tl.float32)
    m = inverse + b * 6
    cx = tl.load(m) * ox + tl.load(m + 1) * oy + tl.load(m + 2)
    cy = tl.load(m + 3) * ox + tl.load(m + 4) * oy + tl.load(m + 5)
    fx, fy = tl.floor(cx), tl.floor(cy)
    ax, ay = cx - fx, cy - fy
    x0, y0 = fx.to(tl.int32), fy.to(tl.int32)
    bx, by = 1.0 - ax, 1.0 - ay
    at00, at01, at10, at11, in00, in01, in10, in11 = _neighbours(tiles, b, x0, y0, inside, slot)
    r0, g0, b0 = _read(pixels, at00, in00, grey)
    r1, g1, b1 = _read(pixels, at01, in01, grey)
    r2, g2, b2 = _read(pixels, at10, in10, grey)
    r3, g3, b3 = _read(pixels, at11, in11, grey)
    r = bx * by * r0 + ax * by * r1 + bx * ay * r2 + ax * ay * r3
    g = bx * by * g0 + ax * by * g1 + bx * ay * g2 + ax * ay * g3
    bl = bx * by * b0 + ax * by * b1 + bx * ay * b2 + ax * ay * b3
    r, g, bl = _level(r), _level(g), _level(bl)
    # OpenCV's 8-bit RGB to HSV (gpu_augment.rgb_to_hsv8)
    val = tl.maximum(tl.maximum(r, g), bl)
    diff = val - tl.minimum(tl.minimum(r, g), bl)
    sat = tl.where(val > 0, _round(diff * 255.0 / tl.maximum(val, 1.0)), 0.0)
    safe = tl.maximum(diff, 1.0)
    hue = tl.where(
        val == r,
        (g - bl) * 60.0 / safe,
        tl.where(val == g, 120.0 + (bl - r) * 60.0 / safe, 240.0 + (r - g) * 60.0 / safe),
    )
    hue = tl.where(diff > 0, hue, 0.0)
    hue = tl.where(hue < 0, hue + 360.0, hue)
    hue = _round(hue / 2.0)
    hue = tl.where(hue >= 180.0, hue - 180.0, hue)
    # the plan's lookup tables
    table = tables + b * 768
    hue = tl.load(table + hue.to(tl.int32), mask=inside, other=0).to(tl.float32)
    sat = tl.load(table + 256 + sat.to(tl.int32), mask=inside, other=0).to(tl.float32)
    val = tl.load(table + 512 + val.to(tl.int32), mask=inside, other=0).to(tl.float32)
    # and back (gpu_augment.hsv8_to_rgb)
    h = hue * (6.0 / 180.0)
    s = sat / 255.0
    sector = tl.floor(h)
    f = h - sector
    sector = tl.where(sector >= 6.0, sector - 6.0, sector)
    p = val * (1.0 - s)
    q = val * (1.0 - s * f)
    t = val * (1.0 - s * (1.0 - f))
    r = tl.where(sector == 4, t, tl.where((sector == 0) | (sector == 5), val, p))
    r = tl.where(sector == 1, q, r)
    g = tl.where(sector == 0, t, tl.where(sector < 3, val, tl.where(sector == 3, q, p)))
    bl = tl.where(sector < 2, p, tl.where(sector == 2, t, tl.where(sector < 5, val, q)))
    at = out + (b * size * size + offs) * 3
    tl.store(at, _level(r).to(tl.uint8), mask=inside)
    tl.store(at + 1, _level(g).to(tl.uint8), mask=inside)
    tl.store(at + 2, _level(bl).to(tl.uint8), mask=inside)
