"""Check one image file completely: it opens, decodes to the end, and what it will need.

Pillow decodes the whole file (``verify`` alone misses a truncated JPEG), so a file that passes
here will not fail half-way through training. Decoding for training is the loader's job; this
is the once-per-file check whose result is cached by size and modification time.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from falconet.data.records import Problem

EXIF_ORIENTATION = 0x0112
ORIENTED = "exif-orientation"
"""The problem code of an image stored turned or mirrored (EXIF orientation other than 1)."""
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")

_CONVERSIONS = {
    "L": ("grayscale", "grayscale image, converted to RGB"),
    "LA": ("grayscale", "grayscale image with alpha, converted to RGB"),
    "RGBA": ("alpha", "RGBA image, alpha dropped"),
    "P": ("palette", "palette image, converted to RGB"),
    "PA": ("palette", "palette image with alpha, converted to RGB"),
    "I;16": ("16-bit", "16-bit image, scaled to 8 bits"),
    "I;16B": ("16-bit", "16-bit image, scaled to 8 bits"),
    "I": ("16-bit", "32-bit integer image, scaled to 8 bits"),
    "CMYK": ("cmyk", "CMYK image, converted to RGB"),
}


@dataclass(frozen=True)
class ImageInfo:
    """Size as training will see it (after EXIF orientation) and the stored mode."""

    width: int
    height: int
    mode: str


def inspect_image(path: Path) -> tuple[ImageInfo | None, list[Problem]]:
    """``(info, problems)``; ``info`` is None when the image cannot be used at all."""
    from PIL import Image, UnidentifiedImageError

    where = str(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None, [Problem("missing-image", where, "no such file", "skipped")]
    except OSError as exc:
        return None, [Problem("unreadable-image", where, f"cannot read: {exc.strerror}", "skipped")]
    if size == 0:
        return None, [Problem("zero-byte-image", where, "empty file (0 bytes)", "skipped")]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow warns on odd EXIF; the checks below report
            with Image.open(path) as image:
                image.load()  # full decode: raises on truncated or corrupt data
                mode, (width, height) = image.mode, image.size
                orientation = image.getexif().get(EXIF_ORIENTATION, 1)
    except UnidentifiedImageError:
        return None, [
            Problem("corrupt-image", where, "not an image Pillow can identify", "skipped")
        ]
    except OSError as exc:
        code = "truncated-image" if "truncated" in str(exc) else "corrupt-image"
        return None, [Problem(code, where, f"cannot decode: {exc}", "skipped")]
    except Exception as exc:  # decoders raise assorted errors on hostile files
        return None, [
            Problem(
                "corrupt-image", where, f"cannot decode: {type(exc).__name__}: {exc}", "skipped"
            )
        ]
    problems = []
    if mode in _CONVERSIONS:
        code, message = _CONVERSIONS[mode]
        problems.append(Problem(code, where, message, "converted"))
    if orientation not in (1, None):
        problems.append(
            Problem(
                ORIENTED,
                where,
                f"EXIF orientation {orientation}: "
                "the image is rotated as viewers show it, labels refer to that",
                "converted",
            )
        )
        if orientation in (5, 6, 7, 8):
            width, height = height, width
    return ImageInfo(width, height, mode), problems
