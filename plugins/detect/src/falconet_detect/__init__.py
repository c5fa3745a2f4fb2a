"""falconet plugin: the YOLO family and its label assigners. Torch is imported only when a
model, loss or assigner is used, so listing plugins stays fast."""

from __future__ import annotations

from falconet.registry import Register


def register_families(register: Register) -> None:
    from falconet_detect.family import YoloFamily

    register(YoloFamily())


def register_assigners(register: Register) -> None:
    from falconet_detect.assigners import HUNGARIAN, SIMOTA, TAL

    for assigner in (TAL, SIMOTA, HUNGARIAN):
        register(assigner)
