"""The training keys of falconet-detr, declared through ``register_train_keys``; the family
reads them back, typed, when a run configures it (:meth:`DetrFamily.configure`).
docs/detr.md says what each does, what it costs and how its default was chosen."""

from __future__ import annotations

from pydantic import BaseModel, Field

from falconet.keys import KeyGroup


class DetrKeys(BaseModel):
    """``query_groups``: how the detr family trains its decoder."""

    query_groups: int = Field(
        1,
        ge=1,
        le=64,
        description="model=detr-*: decoder query groups in training (Group DETR: each group "
        "its own proposals, matched one-to-one to the boxes on its own, groups blind to each "
        "other, losses averaged); inference runs the first group only, at the same cost; "
        "training's decoder and proposal cost grow with it; 1 = one set (docs/detr.md)",
    )


DETR_KEYS = KeyGroup("detr", "how the detr family trains (query groups)", DetrKeys)
