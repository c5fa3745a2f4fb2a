"""The pytest plugin: fixtures for a fresh plugin manager, for temporary plugins and for running
the installed ``falconet`` command."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from falconet.plugins import PluginRecord, Plugins
from falconet_testing.fixtures import fresh_plugins

_counter = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    """The marker the contract suites put on their GPU checks."""
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped with a reason elsewhere")


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


@pytest.fixture
def falconet_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the installed ``falconet`` command in a subprocess: ``falconet_cli(*args, env=..)``.

    ``site`` prepends a folder to ``PYTHONPATH``; ``env`` adds variables. ``FALCONET_*`` of the
    calling shell are removed so the tests do not depend on it.
    """

    def run(
        *args: str,
        site: Path | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        full = {k: v for k, v in os.environ.items() if not k.startswith("FALCONET_")}
        if site is not None:
            full["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(site), full.get("PYTHONPATH", "")) if p
            )
        full.update(env or {})
        return subprocess.run(
            [sys.executable, "-m", "falconet", *args],
            capture_output=True,
            text=True,
            env=full,
            cwd=cwd,
            timeout=timeout,
        )

    return run
