"""falconet: a performance-first trainer for object detectors.

Importing this package is cheap (no torch): the plugin system and CLI load in well under a
second on any machine. See :mod:`falconet.plugins` for the plugin manager.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from falconet.hookspecs import hookimpl

try:
    __version__ = version("falconet-core")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["Detector", "__version__", "hookimpl"]


def __getattr__(name: str):  # Detector imports torch: only when asked for
    if name == "Detector":
        from falconet.detector import Detector

        return Detector
    raise AttributeError(f"module 'falconet' has no attribute {name!r}")
