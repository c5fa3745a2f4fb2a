"""falconet plugin: the ``profiler`` callback (``profile=true``) and ``falconet profile``.

Loading registers three cheap items (the callback, its keys and the command); torch and the
analysis modules are imported only when a profile is taken or read.
"""

from __future__ import annotations

from falconet.registry import Register

SCHEMA = 1
"""Version of ``profile.json``; fields are only ever added within a version."""


def register_callbacks(register: Register) -> None:
    from falconet_profiler.callback import Profiler

    register(Profiler)


def register_train_keys(register: Register) -> None:
    from falconet_profiler.keys import PROFILER_KEYS

    register(PROFILER_KEYS)


def register_commands(register: Register) -> None:
    from falconet_profiler.cli import profile

    register(profile)
