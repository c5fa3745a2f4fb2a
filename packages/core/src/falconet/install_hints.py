"""Install hints: the distribution to install for a name that nothing registered.

The catalogue is data (``install_hints.toml``, shipped with the core), so the core's source names
no plugin; it is read once, on the first miss.
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib.resources import files


@cache
def install_hints() -> dict[str, dict[str, str]]:
    """Each registry kind (``graph_backends``, ``train_keys``, ...) to its names' distributions."""
    return tomllib.loads(files("falconet").joinpath("install_hints.toml").read_text("utf-8"))


def known_provider(kind: str, name: str) -> str | None:
    """The distribution that provides ``name`` of ``kind``, when the catalogue lists it."""
    return install_hints().get(kind, {}).get(name)
