"""falconet plugin: the ``hotcoco`` eval backend. hotcoco is imported only when evaluating."""

from __future__ import annotations

from falconet.registry import Register


def register_eval_backends(register: Register) -> None:
    from falconet_eval_hotcoco.backend import HotcocoBackend

    register(HotcocoBackend())
