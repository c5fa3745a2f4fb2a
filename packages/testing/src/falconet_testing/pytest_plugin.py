"""The pytest plugin: fixtures for a fresh plugin manager and for temporary plugins."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from falconet.plugins import PluginRecord, Plugins
from falconet_testing.fixtures import fresh_plugins

_counter = itertools.count()


@pytest.fixture
def falconet_plugins() -> Plugins:
    """A fresh manager holding falconet's built-ins only (no installed plugin, no env flags)."""
    return fresh_plugins()


@pytest.fixture
def installed_falconet_plugins() -> Plugins:
    """A fresh manager with the built-ins and every installed ``falconet`` entry point."""
    return fresh_plugins(installed=True)


@pytest.fixture
def add_falconet_plugin(falconet_plugins: Plugins) -> Callable[..., PluginRecord]:
    """Register a temporary plugin on ``falconet_plugins``: ``add_falconet_plugin(obj)``.

    ``obj`` is any object with ``register_*`` functions (a module, a class instance, a
    :class:`types.SimpleNamespace`). Keyword arguments ``name``, ``distribution`` and
    ``version`` set what the report shows. Returns the plugin's record (check ``.status``).
    """

    def add(
        plugin: object,
        *,
        name: str | None = None,
        distribution: str = "test-plugin",
        version: str = "0",
    ) -> PluginRecord:
        return falconet_plugins.add_plugin(
            plugin, name or f"temporary-{next(_counter)}", distribution, version
        )

    return add
