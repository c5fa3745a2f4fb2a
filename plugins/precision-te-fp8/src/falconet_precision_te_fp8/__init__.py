"""falconet plugin: the ``fp8`` precision backend, its keys and its lever. Transformer Engine
is imported only when a run trains in fp8, so ``falconet plugins list`` loads this plugin for
free."""

from __future__ import annotations

from falconet.registry import Register


def register_precision_backends(register: Register) -> None:
    from falconet_precision_te_fp8.backend import Fp8Precision

    register(Fp8Precision())


def register_train_keys(register: Register) -> None:
    from falconet_precision_te_fp8.keys import FP8_KEYS

    register(FP8_KEYS)


def register_levers(register: Register) -> None:
    from falconet_precision_te_fp8.levers import LEVERS

    for lever in LEVERS:
        register(lever)
