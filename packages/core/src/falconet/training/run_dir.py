"""Run folders: a new one per run (``exp``, ``exp2``, ...) and the latest one to resume."""

from __future__ import annotations

import os
from pathlib import Path

from falconet.training.config import ConfigError


def new_run_dir(project: str, name: str, exist_ok: bool = False, *, weights: bool = True) -> Path:
    """``project/name``, or ``name2``, ``name3``, ... when taken (unless ``exist_ok``), made
    with a ``weights/`` folder inside when ``weights``."""
    base = Path(project)
    candidate, n = base / name, 2
    while candidate.exists() and not exist_ok:
        candidate, n = base / f"{name}{n}", n + 1
    (candidate / "weights" if weights else candidate).mkdir(parents=True, exist_ok=True)
    return candidate


def latest_checkpoint(project: str) -> Path:
    """The most recently written ``last.pt`` under ``project`` (for ``resume=true``)."""
    found = sorted(Path(project).glob("*/weights/last.pt"), key=os.path.getmtime)
    if not found:
        raise ConfigError(
            f"resume=true: no {project}/*/weights/last.pt to resume; pass resume=PATH/last.pt"
        )
    return found[-1]
