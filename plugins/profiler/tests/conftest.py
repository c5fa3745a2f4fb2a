"""A real CPU profile of a short run, shared by the artifact, HTML and CLI tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def profile_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 24 + 8 image, 64-pixel shapes set: three batches of 8 per epoch."""
    from falconet.data.shapes import write_shapes

    return write_shapes(tmp_path_factory.mktemp("shapes"), {"train": 24, "val": 8}, size=64)


@pytest.fixture(scope="session")
def run_keys(profile_data: Path) -> dict[str, Any]:
    """A fast CPU run: batch 8 with nbs 16 (accumulate 2), no validation or plots."""
    return {
        "data": str(profile_data),
        "imgsz": 64,
        "batch": 8,
        "nbs": 16,
        "workers": 0,
        "val": False,
        "plots": False,
    }


@pytest.fixture(scope="session")
def profiled_run(run_keys: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of a 3-epoch run profiled over 1 discarded (the first optimizer step, at
    accumulate 2) + 6 measured batches."""
    from falconet import Detector

    summary = Detector("yolo-n").train(
        **run_keys,
        epochs=3,
        profile=True,
        profile_warmup=0,
        profile_steps=6,
        project=str(tmp_path_factory.mktemp("runs")),
    )
    return Path(summary["run_dir"])
