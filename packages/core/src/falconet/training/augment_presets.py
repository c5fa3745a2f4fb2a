"""``augment=``: named sets of the augmentation keys, so that one key turns augmentation off
or sets its strength, for the CPU and the GPU path alike (both read the same keys).

A preset is a layer between the family's recipe (with the data yaml's ``train_defaults:``) and
the keys a run names: ``augment=light mosaic=0.2`` is the light preset with mosaic at 0.2.
``default`` sets nothing (the family's recipe as it is); ``none`` (or ``augment=false``) turns
every augmentation off, the letterboxed image as it is.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "none": dict(
        mosaic=0.0,
        close_mosaic=0,
        degrees=0.0,
        translate=0.0,
        shear=0.0,
        scale=0.0,
        hsv_h=0.0,
        hsv_s=0.0,
        hsv_v=0.0,
        fliplr=0.0,
    ),
    "light": dict(
        mosaic=0.5,
        degrees=0.0,
        translate=0.05,
        shear=0.0,
        scale=0.25,
        hsv_h=0.01,
        hsv_s=0.35,
        hsv_v=0.2,
        fliplr=0.5,
    ),
    "heavy": dict(
        mosaic=1.0,
        degrees=10.0,
        translate=0.2,
        shear=2.0,
        scale=0.9,
        hsv_h=0.015,
        hsv_s=0.7,
        hsv_v=0.4,
        fliplr=0.5,
    ),
}
"""Each preset's keys (``light`` and ``heavy`` about halve and raise the YOLO recipe's)."""

OFF = ("false", "off", "no", "0")
ON = ("true", "on", "yes", "1")


def preset_name(value: Any) -> str:
    """``augment``'s value as a preset's name: a boolean (or its spelling on the command line)
    is ``default`` or ``none``. Raises ``ValueError`` naming the presets."""
    text = str(value).strip().lower()
    if text in OFF:
        return "none"
    if text in ON:
        return "default"
    if text not in PRESETS:
        raise ValueError(
            f"augment={value!r}: expected one of {', '.join(PRESETS)}, or true / false"
        )
    return text


def preset_keys(keys: dict[str, Any]) -> dict[str, Any]:
    """The augmentation keys ``keys``' ``augment`` sets (``{}`` where it names none, or names
    no preset: the key's own check then says so)."""
    try:
        return dict(PRESETS[preset_name(keys["augment"])]) if "augment" in keys else {}
    except ValueError:
        return {}
