"""Training augmentation on the GPU, batched: a batch of plans (:mod:`falconet.data.plans`)
rendered from images resident in device memory, with static output shapes.

What the CPU loader does per image with OpenCV (place the images on the canvas, warp the
canvas by the plan's affine matrix with bilinear interpolation and a grey border, then scale
hue, saturation and value through lookup tables) is done here for a whole batch at once:

* **Warp.** Bilinear interpolation is linear in the canvas, and the canvas is the sum of its
  tiles (each image masked to the part placed on the canvas) plus grey where no tile is. So the
  warped canvas is the sum over the four tiles of each masked image sampled by
  ``grid_sample`` (bilinear, zero outside), with the mask sampled beside it as a fourth
  channel, plus grey times one minus the sampled masks: four ``grid_sample`` calls for the
  batch, whatever mixes of mosaic and letterbox it holds. A sample without mosaic has one tile.
* **Colour.** RGB to OpenCV's 8-bit HSV (hue in ``[0, 180)``), each channel through the plan's
  own lookup table (:func:`falconet.data.transforms.hsv_tables`, the CPU's tables), back to RGB.

Pixels match the CPU path up to interpolation rounding (OpenCV interpolates in fixed point,
1/32 of a pixel, and converts colour through integer tables; this module computes in float32
and rounds once per stage); the boxes are the plan's, computed once on the host, so they are
the CPU path's exactly. The functions run on any device, so the CPU tests compare them with
the OpenCV path directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from falconet.data import gpu_render
from falconet.data.plans import TILES, BatchPlan
from falconet.data.transforms import PAD_VALUE


@dataclass(frozen=True)
class ImageStore:
    """Every image of a split, resident on one device.

    :param pixels: ``[n, S, S, 3]`` uint8 RGB, image ``i`` (long side ``S``) in the top-left
        corner of its slot, the rest zeros.
    :param shapes: ``(height, width)`` of each image, on the host.
    """

    pixels: torch.Tensor
    shapes: list[tuple[int, int]]

    @property
    def size(self) -> int:
        return self.pixels.shape[1]

    def shape(self, index: int) -> tuple[int, int]:
        return self.shapes[index]


@dataclass(frozen=True)
class PlanTensors:
    """A batch of plans as device tensors (made on the host, copied in one go each).

    ``tiles [B, 4, 7]`` int64 (:class:`falconet.data.plans.BatchPlan`'s, image ``-1`` where a
    canvas has fewer than four), ``inverse [B, 2, 3]`` float32 (output to canvas pixels) and
    ``tables [B, 3, 256]`` uint8 (hue, saturation and value lookup tables)."""

    tiles: torch.Tensor
    inverse: torch.Tensor
    tables: torch.Tensor

    @classmethod
    def from_plan(cls, plan: BatchPlan, *, pin: bool = False) -> PlanTensors:
        """The plan's tensors on the host (in pinned memory with ``pin``)."""
        tiles = torch.from_numpy(plan.tiles)
        inverse = torch.from_numpy(plan.inverse())
        tables = torch.from_numpy(plan.tables())
        if pin:
            tiles, inverse, tables = pinned(tiles), pinned(inverse), pinned(tables)
        return cls(tiles, inverse, tables)

    def to(self, device: torch.device) -> PlanTensors:
        """On ``device``, copied without waiting where the host side is pinned."""
        return PlanTensors(
            *(
                t.to(device, non_blocking=t.is_pinned())
                for t in (self.tiles, self.inverse, self.tables)
            )
        )


def pinned(host: torch.Tensor) -> torch.Tensor:
    """``host`` copied into pinned memory by numpy. ``Tensor.pin_memory()`` copies with
    torch's CPU kernel, which splits a copy of more than 32,768 elements (a batch of 64's
    lookup tables: 49,152 bytes) over torch's OpenMP pool, whose threads then spin on every
    core after each such copy; numpy copies on the calling thread alone."""
    out = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
    np.copyto(out.numpy(), host.numpy())
    return out


def render(
    store: ImageStore, plans: PlanTensors, size: int, *, fused: bool | None = None
) -> torch.Tensor:
    """The batch's augmented images, ``[B, 3, size, size]`` uint8 in channels_last memory:
    on a GPU by the fused kernel (:mod:`falconet.data.gpu_render`, where Triton is there;
    ``fused=False`` asks for the reference below), elsewhere by the torch operations here."""
    if fused is None:
        fused = gpu_render.available(store.pixels.device)
    if fused:
        return gpu_render.render_fused(
            store.pixels, plans.tiles, plans.inverse, plans.tables, size, PAD_VALUE
        )
    warped = warp(store, plans, size)  # [B, 3, S, S] float, rounded to levels
    return colour(warped, plans.tables).contiguous(memory_format=torch.channels_last)


def half_up(x: torch.Tensor) -> torch.Tensor:
    """Rounded half up, as OpenCV's fixed point rounds (and the fused kernel)."""
    return torch.floor(x + 0.5)


def warp(store: ImageStore, plans: PlanTensors, size: int) -> torch.Tensor:
    """Each canvas warped into ``size x size`` (bilinear, grey outside every tile), rounded to
    integer levels: ``[B, 3, size, size]`` float32."""
    device, slot = store.pixels.device, store.size
    batch = plans.tiles.shape[0]
    out_y, out_x = torch.meshgrid(
        torch.arange(size, device=device, dtype=torch.float32),
        torch.arange(size, device=device, dtype=torch.float32),
        indexing="ij",
    )
    inv = plans.inverse
    canvas_x = inv[:, 0, 0, None, None] * out_x + inv[:, 0, 1, None, None] * out_y
    canvas_x = canvas_x + inv[:, 0, 2, None, None]
    canvas_y = inv[:, 1, 0, None, None] * out_x + inv[:, 1, 1, None, None] * out_y
    canvas_y = canvas_y + inv[:, 1, 2, None, None]
    slot_axis = torch.arange(slot, device=device)
    total = torch.zeros(batch, 4, size, size, device=device)
    for t in range(TILES):
        image, x1a, y1a, x2a, y2a, x1b, y1b = plans.tiles[:, t].unbind(1)
        present = image >= 0
        source = store.pixels[image.clamp(min=0)].permute(0, 3, 1, 2).float()  # [B, 3, s, s]
        # the part of the image the tile shows, in the image's pixels
        cols = (slot_axis >= x1b[:, None]) & (slot_axis < (x1b + x2a - x1a)[:, None])
        rows = (slot_axis >= y1b[:, None]) & (slot_axis < (y1b + y2a - y1a)[:, None])
        mask = (rows[:, :, None] & cols[:, None, :] & present[:, None, None]).float()
        masked = torch.cat((source * mask[:, None], mask[:, None]), 1)  # [B, 4, s, s]
        # canvas pixels to the image's pixels, then to grid_sample's [-1, 1] (align_corners)
        shift_x = (x1a - x1b).float()[:, None, None]
        shift_y = (y1a - y1b).float()[:, None, None]
        grid = torch.stack((canvas_x - shift_x, canvas_y - shift_y), -1) * (2 / (slot - 1)) - 1
        total += F.grid_sample(masked, grid, "bilinear", "zeros", align_corners=True)
    rgb, coverage = total[:, :3], total[:, 3:]
    return half_up(rgb + PAD_VALUE * (1 - coverage)).clamp_(0, 255)


def colour(rgb: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """``rgb [B, 3, H, W]`` (integer levels, float) through OpenCV's 8-bit HSV and the plans'
    lookup tables and back: ``[B, 3, H, W]`` uint8."""
    hue, sat, val = rgb_to_hsv8(rgb)
    flat = tables.long()
    b = rgb.shape[0]

    def lookup(channel: torch.Tensor, which: int) -> torch.Tensor:
        table = flat[:, which]  # [B, 256]
        return torch.gather(table, 1, channel.long().view(b, -1)).view_as(channel).float()

    return hsv8_to_rgb(lookup(hue, 0), lookup(sat, 1), lookup(val, 2))


def rgb_to_hsv8(rgb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """OpenCV's ``COLOR_RGB2HSV`` for 8-bit images: hue in ``[0, 180)`` (degrees / 2),
    saturation and value in ``[0, 255]``, rounded to integers (float tensors)."""
    r, g, b = rgb.unbind(1)
    val = torch.maximum(torch.maximum(r, g), b)
    low = torch.minimum(torch.minimum(r, g), b)
    diff = val - low
    sat = half_up(torch.where(val > 0, diff * 255 / val.clamp(min=1), 0))
    safe = diff.clamp(min=1)
    hue = torch.where(
        val == r,
        (g - b) * 60 / safe,
        torch.where(val == g, 120 + (b - r) * 60 / safe, 240 + (r - g) * 60 / safe),
    )
    hue = torch.where(diff > 0, hue, 0)
    hue = torch.where(hue < 0, hue + 360, hue)
    hue = half_up(hue / 2)
    return hue.remainder(180), sat, val


def hsv8_to_rgb(hue: torch.Tensor, sat: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """OpenCV's ``COLOR_HSV2RGB`` for 8-bit images: ``[B, 3, H, W]`` uint8."""
    h = hue * (6 / 180)  # sectors of 60 degrees
    s = sat / 255
    sector = torch.floor(h)
    f = h - sector
    sector = sector.remainder(6)
    p = val * (1 - s)
    q = val * (1 - s * f)
    t = val * (1 - s * (1 - f))
    choices = (
        (val, t, p),
        (q, val, p),
        (p, val, t),
        (p, q, val),
        (t, p, val),
        (val, p, q),
    )
    r = torch.zeros_like(val)
    g = torch.zeros_like(val)
    b = torch.zeros_like(val)
    for k, (cr, cg, cb) in enumerate(choices):
        here = sector == k
        r = torch.where(here, cr, r)
        g = torch.where(here, cg, g)
        b = torch.where(here, cb, b)
    return half_up(torch.stack((r, g, b), 1)).clamp_(0, 255).to(torch.uint8)
