"""Where falconet writes what it makes for itself: the cache folder.

``FALCONET_CACHE_DIR`` wins, then ``$XDG_CACHE_HOME/falconet``, then ``~/.cache/falconet``.
Nothing is ever written into a dataset's own folders (they may be read-only).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """A folder under the cache root, created if missing."""
    root = os.environ.get("FALCONET_CACHE_DIR")
    if root:
        base = Path(root)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "falconet"
    folder = base.joinpath(*parts)
    folder.mkdir(parents=True, exist_ok=True)
    return folder
