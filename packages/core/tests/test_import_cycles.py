"""The core has no import cycle (tools/import_cycles.py, docs/plugins.md).

Two graphs are held to none: the imports that run when a module is imported (``module``), and
every import that can run, those inside functions too (``runtime``). Only imports under
``if TYPE_CHECKING:`` may point back up: the contract (:mod:`falconet.contract`) names the
runtime's types that way, for type checkers alone.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "packages/core/src"


def _tool():
    spec = importlib.util.spec_from_file_location("import_cycles", ROOT / "tools/import_cycles.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_cycles", module)
    spec.loader.exec_module(module)
    return module


tool = _tool()


@pytest.mark.parametrize("scope", ["module", "runtime"])
def test_core_has_no_import_cycle(scope: str) -> None:
    edges = tool.graph(SRC, "falconet", scope)
    assert "falconet.plugins" in edges and edges["falconet.training.trainer"]  # read the source
    found = tool.cycles(edges)
    assert not found, "\n".join(
        f"cycle of {len(c)}: "
        + "; ".join(f"{m} -> {', '.join(sorted(edges[m] & set(c)))}" for m in c)
        for c in found
    )


def test_the_tool_sees_what_runs_and_skips_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import b\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import c\n"
        "if TYPE_CHECKING:\n    from pkg import b\n"
        "def f():\n    from pkg.sub.b import x\n"
    )
    (pkg / "sub" / "b.py").write_text("import pkg.a\n")
    (pkg / "c.py").write_text("")
    module = tool.graph(tmp_path, "pkg")
    assert module["pkg.a"] == {"pkg.c"}
    assert module["pkg.sub"] == {"pkg.sub.b"}
    assert module["pkg.sub.b"] == {"pkg.a"}
    assert tool.cycles(module) == []
    runtime = tool.graph(tmp_path, "pkg", "runtime")
    assert runtime["pkg.a"] == {"pkg.c", "pkg.sub", "pkg.sub.b"}
    assert tool.cycles(runtime) == [["pkg.a", "pkg.sub", "pkg.sub.b"]]
    assert "pkg.b" not in tool.graph(tmp_path, "pkg", "all")["pkg.a"]  # no such module
