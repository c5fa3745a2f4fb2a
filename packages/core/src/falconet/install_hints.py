"""Install hints: the distribution to install for a name that nothing registered.

The catalogue is data (``install_hints.toml``, shipped with the core), so the core's source names
no plugin; it is read once, on the first miss.
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib.resources import files
from typing import Any


@cache
def install_hints() -> dict[str, dict[str, Any]]:
    """Each registry kind (``graph_backends``, ``train_keys``, ...) to its names' distributions,
    and ``verdict_levers`` (:func:`lever_hints`)."""
    return tomllib.loads(files("falconet").joinpath("install_hints.toml").read_text("utf-8"))


def known_provider(kind: str, name: str) -> str | None:
    """The distribution that provides ``name`` of ``kind``, when the catalogue lists it."""
    return install_hints().get(kind, {}).get(name)


def lever_hints(verdict: str) -> dict[str, str]:
    """The ``key=value`` levers of profiler verdict ``verdict`` that plugins not installed would
    suggest, each to its distribution (an installed plugin's own levers say when and why)."""
    return dict(install_hints().get("verdict_levers", {}).get(verdict, {}))
