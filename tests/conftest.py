"""Cross-package fixtures: real installations of fixture plugins, kept aside.

``tests/fixtures/broken-plugin`` and ``priority-plugin`` are each built into a wheel with
hatchling and unpacked into a temporary site folder (what an installer does with a pure-Python
wheel), so their entry points are discovered by ``importlib.metadata`` exactly as an installed
distribution's are, but only by the tests that put that folder on their path; the development
environment stays clean. And
``load_tool``: a script of ``tools/`` imported by its path, for the tests of its logic.
"""

from __future__ import annotations

import importlib.util
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
TOOLS = Path(__file__).resolve().parents[1] / "tools"


def _load_tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_tool() -> Callable[[str], ModuleType]:
    """``load_tool(name)``: ``tools/<name>.py`` as a module (tools/ is no package)."""
    return _load_tool


def _installed(fixture: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the fixture distribution ``tests/fixtures/<fixture>``, built into a
    wheel with hatchling and unpacked as an installer would."""
    from hatchling.builders.wheel import WheelBuilder

    dist = tmp_path_factory.mktemp("dist")
    site = tmp_path_factory.mktemp("site")
    (wheel,) = WheelBuilder(str(FIXTURES / fixture)).build(
        directory=str(dist), versions=["standard"]
    )
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


@pytest.fixture(scope="session")
def broken_plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the installed ``falconet-broken-plugin`` distribution."""
    return _installed("broken-plugin", tmp_path_factory)


@pytest.fixture(scope="session")
def priority_plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the installed ``falconet-priority-plugin`` distribution."""
    return _installed("priority-plugin", tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 24 + 8 image, 64-pixel shapes set (the yaml's path): a training run over it takes
    about a second per epoch on one CPU core."""
    from falconet.data.shapes import write_shapes

    return write_shapes(tmp_path_factory.mktemp("tiny-shapes"), {"train": 24, "val": 8}, size=64)


@pytest.fixture(scope="session")
def tiny_keys(tiny_shapes: Path) -> Callable[[Path], dict[str, str]]:
    """``tiny_keys(project)``: the keys of ``tiny_run`` writing under ``project``, for a
    module-scoped fixture that trains once for several tests."""

    def keys(project: Path) -> dict[str, str]:
        return {
            "data": str(tiny_shapes),
            "imgsz": "64",
            "batch": "8",
            "workers": "0",
            "plots": "false",
            "project": str(project),
        }

    return keys


@pytest.fixture
def tiny_run(tiny_keys: Callable[[Path], dict[str, str]], tmp_path: Path) -> dict[str, str]:
    """Keys of a fast training run on ``tiny_shapes``, writing under ``tmp_path/runs``."""
    return tiny_keys(tmp_path / "runs")
