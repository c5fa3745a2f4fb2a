"""falconet plugin: the RT-DETR-style family, registered as any third-party family would be,
with its training keys. Torch is imported only when a model or loss is built, so listing
plugins stays fast."""

from __future__ import annotations

from falconet.registry import Register


def register_families(register: Register) -> None:
    from falconet_detr.family import DetrFamily

    register(DetrFamily())


def register_train_keys(register: Register) -> None:
    from falconet_detr.keys import DETR_KEYS

    register(DETR_KEYS)
