"""Training keys a plugin declares for itself, registered through ``register_train_keys``.

A plugin whose backend or callback reads options of its own declares them as a pydantic model,
typed, defaulted and described, and registers it as a :class:`KeyGroup`; the core adds the
group's fields to the run's configuration (:func:`falconet.training.config.config_model`), so
``falconet train --help``, ``args.yaml``, unknown-key errors and the printed key list include
them, and the core never names them. The plugin reads its keys back, typed, from the options a
backend is given (:meth:`falconet.contract.GraphContext.keys`).

Importing this module imports pydantic only, so registering a group costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel


@dataclass(frozen=True)
class KeyGroup:
    """A plugin's training keys: every field of ``keys`` is a key (its ``description`` is the
    help text); ``name`` and ``summary`` identify the group in ``falconet plugins list``."""

    name: str
    summary: str
    keys: type[BaseModel]

    def __post_init__(self) -> None:
        if not (isinstance(self.keys, type) and issubclass(self.keys, BaseModel)):
            raise TypeError(
                f"KeyGroup {self.name!r}: keys must be a pydantic BaseModel subclass, "
                f"got {self.keys!r}"
            )
