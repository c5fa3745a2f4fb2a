"""Plain helpers behind the pytest fixtures, usable without pytest too."""

from __future__ import annotations

from falconet.plugins import Plugins


def fresh_plugins(*, installed: bool = False) -> Plugins:
    """A new plugin manager that ignores the caller's ``FALCONET_*`` environment.

    :param installed: also load every installed entry point (else only falconet's built-ins,
        so a test sees exactly the plugins it adds).
    """
    plugins = Plugins(env={}).load_builtins()
    return plugins.load_entry_points() if installed else plugins
