"""Multi-scale training (``multi_scale=``): each batch trains at one size of a small set fixed
when the run is planned.

The key names the set (:func:`canonical` gives the form ``args.yaml`` keeps, :func:`size_set`
the sizes for an ``imgsz``), square sizes that are multiples of the network's largest stride
(:data:`STRIDE`):

* ``false`` (the default): every batch at ``imgsz``;
* ``true``, or a fraction ``f`` below 1: sizes within ``imgsz x (1 - f)`` to ``imgsz x (1 + f)``
  (``true`` is ``0.5``, the ±50% of Ultralytics' ``multi_scale``);
* a range of fractions of ``imgsz``, ``0.5-1.5``;
* sizes in pixels, ``320,480,640`` (at most :data:`MAX_SIZES`).

A range gives each stride multiple inside it, or, where more than :data:`RANGE_SIZES` fit,
that many spread evenly from its smallest to its largest (640 px at ``0.5-1.5``: 320, 480, 640,
800, 960). The set is small and fixed on purpose: the graph backends key their recordings by
the input's shape, so each size is recorded once, and no batch meets a shape never seen.

Which size a batch trains at is drawn from the run's seed, the epoch and the batch's place in
it (:class:`SizeDraw`): the same on every rank, for any number of workers, and in a resumed
run. The loaders render every batch at ``imgsz`` (their caches, pinned buffers and the GPU
path's kernels keep one size); the loop resizes the images on the device, bilinearly, and
scales the boxes with them (:func:`rescale`), as Ultralytics does. Validation stays at
``imgsz``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from falconet.data.targets import Targets

STRIDE = 32
"""The network's largest stride: ``imgsz`` and every training size are multiples of it."""

RANGE_SIZES = 5
"""The most sizes a range gives, spread evenly over it."""

MAX_SIZES = 8
"""The most sizes a list may name."""

OFF = "false"
DEFAULT_FRACTION = 0.5  # multi_scale=true: imgsz ±50%, as Ultralytics' multi_scale
_FALSE = ("false", "no", "0", "off", "none", "")
_TRUE = ("true", "yes", "1", "on")
_LARGEST_FRACTION = 4.0  # a range end above this is taken for pixels: refused, with the hint


def canonical(value: Any) -> str:
    """``value`` (a bool, a number, a list of sizes or the text a user types) as the key keeps
    it: ``false``, a range of fractions ``0.5-1.5``, or sizes ``320,480,640`` (sorted). Raises
    :class:`ValueError` naming what is allowed; the stride is checked by :func:`size_set`."""
    if value is None or value is False:
        return OFF
    if value is True:
        return _fraction(DEFAULT_FRACTION)
    if isinstance(value, (list, tuple)):
        return _sizes_text([_size(v) for v in value])
    if isinstance(value, (int, float)):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError(f"expected false, true, a fraction, a range or sizes, got {value!r}")
    text = value.strip().lower()
    if text in _FALSE:
        return OFF
    if text in _TRUE:
        return _fraction(DEFAULT_FRACTION)
    if "," in text:
        return _sizes_text([_size(part) for part in text.split(",") if part.strip()])
    if "-" in text:
        return _range(text)
    number = _number(text)
    if number.is_integer() and number >= STRIDE:
        return _sizes_text([int(number)])  # one size: every batch at it
    if not 0 < number < 1:
        raise ValueError(
            f"{text} is neither a fraction between 0 and 1 (0.5: imgsz ±50%) nor a size of "
            f"{STRIDE} px or more; a range is two fractions (0.5-1.5)"
        )
    return _fraction(number)


def size_set(spec: str, imgsz: int, stride: int = STRIDE) -> tuple[int, ...]:
    """The training sizes of ``spec`` (:func:`canonical`'s form) at ``imgsz``, smallest first;
    ``()`` when off. Raises :class:`ValueError` for a size that is not a multiple of ``stride``
    and for a range with no multiple of ``stride`` inside."""
    spec = canonical(spec)
    if spec == OFF:
        return ()
    if "-" not in spec:
        sizes = tuple(int(part) for part in spec.split(","))
        for size in sizes:
            if size % stride:
                closest = max(stride, round(size / stride) * stride)
                raise ValueError(
                    f"{size} is not a multiple of {stride} (the network's largest stride); "
                    f"try {closest}"
                )
        return sizes
    low_fraction, high_fraction = (float(end) for end in spec.split("-"))
    # a hair of slack: 0.7 x 640 / 32 is 14.000000000000002 in floats, and is 14
    low = max(stride, math.ceil(low_fraction * imgsz / stride - 1e-9) * stride)
    high = math.floor(high_fraction * imgsz / stride + 1e-9) * stride
    if high < low:
        raise ValueError(
            f"{spec} of imgsz={imgsz} is {low_fraction * imgsz:g}-{high_fraction * imgsz:g} px, "
            f"which holds no multiple of {stride} (the network's largest stride) of at least "
            f"{stride}; widen the range or list sizes (such as {max(stride, imgsz // 2)},{imgsz})"
        )
    count = (high - low) // stride + 1
    if count <= RANGE_SIZES:
        return tuple(range(low, high + 1, stride))
    spread = (low + (high - low) * k / (RANGE_SIZES - 1) for k in range(RANGE_SIZES))
    return tuple(sorted({round(size / stride) * stride for size in spread}))


@dataclass(frozen=True)
class SizeDraw:
    """The size each batch trains at: ``draw(epoch, batch)`` is one of ``sizes``, a function
    of ``seed``, the epoch and the batch's index in it alone (nothing is drawn from a shared
    generator), so every rank draws the same and a resumed run draws what the run it
    continues would have."""

    sizes: tuple[int, ...]
    seed: int

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ValueError("SizeDraw needs at least one size")

    def __call__(self, epoch: int, batch: int) -> int:
        rng = np.random.default_rng([self.seed, epoch, batch, 0x6D756C74])
        return self.sizes[int(rng.integers(len(self.sizes)))]


def size_draw(spec: str, imgsz: int, seed: int) -> SizeDraw | None:
    """The run's :class:`SizeDraw`, or ``None`` when ``multi_scale`` is off."""
    sizes = size_set(spec, imgsz)
    return SizeDraw(sizes, seed) if sizes else None


def largest_size(spec: str, imgsz: int) -> int:
    """The largest image a run of ``spec`` trains on (``imgsz`` when off): what a probe of the
    step's memory must fit."""
    return max(size_set(spec, imgsz), default=imgsz)


def rescale(images: torch.Tensor, targets: Targets, size: int) -> tuple[torch.Tensor, Targets]:
    """``images [B, 3, S, S]`` resized to ``size`` (bilinear, channels_last) and ``targets``
    with their boxes scaled by ``size / S`` (padding slots stay zeros); both as they are when
    ``size`` is ``S``."""
    import torch
    import torch.nn.functional as F

    current = images.shape[-1]
    if size == current:
        return images, targets
    resized = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    resized = resized.contiguous(memory_format=torch.channels_last)
    return resized, dataclasses.replace(targets, boxes=targets.boxes * (size / current))


def _fraction(f: float) -> str:
    return f"{1 - f:g}-{1 + f:g}"


def _range(text: str) -> str:
    ends = text.split("-")
    if len(ends) != 2 or not all(e.strip() for e in ends):
        raise ValueError(f"{text} is not a range of two fractions of imgsz, such as 0.5-1.5")
    low, high = (_number(e) for e in ends)
    if high > _LARGEST_FRACTION:
        raise ValueError(
            f"{text}: a range is fractions of imgsz (such as 0.5-1.5); to name sizes in "
            f"pixels, list them (such as 320,480,640)"
        )
    if not 0 < low <= high:
        raise ValueError(f"{text} is an empty range: it needs 0 < low <= high (such as 0.5-1.5)")
    return f"{low:g}-{high:g}"


def _sizes_text(sizes: Sequence[int]) -> str:
    unique = sorted(set(sizes))
    if not unique:
        raise ValueError("names no size; list sizes in pixels, such as 320,480,640")
    if len(unique) > MAX_SIZES:
        raise ValueError(
            f"names {len(unique)} sizes, and each is a recording of the graph backends: "
            f"at most {MAX_SIZES}"
        )
    return ",".join(map(str, unique))


def _size(value: Any) -> int:
    number = _number(str(value).strip())
    if not number.is_integer() or number < STRIDE:
        raise ValueError(f"{value} is not a size in pixels ({STRIDE} or more)")
    return int(number)


def _number(text: str) -> float:
    try:
        number = float(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a number: expected false, true, a fraction (0.5), a range of "
            "fractions of imgsz (0.5-1.5) or sizes (320,480,640)"
        ) from None
    if not math.isfinite(number):
        raise ValueError(f"{text} is not a finite number")
    return number
