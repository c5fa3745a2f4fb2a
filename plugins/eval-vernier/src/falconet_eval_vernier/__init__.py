"""falconet plugin: the ``vernier`` eval backend. vernier is imported only when evaluating."""

from __future__ import annotations

from falconet.registry import Register


def register_eval_backends(register: Register) -> None:
    from falconet_eval_vernier.backend import VernierBackend

    register(VernierBackend())
