"""The import cycles of a package: strongly connected components of its module-level imports.

    python tools/import_cycles.py                      # falconet, from packages/core/src
    python tools/import_cycles.py --src plugins/detect/src --package falconet_detect
    python tools/import_cycles.py --edges              # each cycle's edges, file by file

Reads the source with ``ast`` and runs nothing. An edge ``a -> b`` is an ``import`` or
``from ... import`` that runs when ``a`` is imported: statements at module level, in class
bodies and inside ``try``/``if``/``with`` blocks there, but not under ``if TYPE_CHECKING:`` and
not inside a function (it runs later, or never); ``--scope`` widens that (:data:`SCOPES`). A
module imported by name (``importlib.import_module``, an entry point) is no edge: that is how
plugins, the core's own among them, are loaded. Importing ``p.q.r`` runs ``p`` and ``p.q``
first, so the edge goes to each package on the way; ``from p import name`` goes to ``p.name``
too where that is a module. Prints each component of more than one module (or a module that
imports itself) with its size, largest first, and exits 1 when there is one:
``packages/core/tests/test_import_cycles.py`` holds the core to none.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCOPES = ("module", "runtime", "all")
"""Which imports are edges: ``module``, those that run when the module is imported (the
default); ``runtime``, also those inside functions and methods (every import that can run);
``all``, also those under ``if TYPE_CHECKING:`` (what a type checker follows)."""


def modules(src: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``src``: dotted name -> file."""
    found = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_statements(body: list[ast.stmt], scope: str) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports of ``body`` in ``scope`` (:data:`SCOPES`)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if scope == "all" or not _is_type_checking(node.test):
                yield from _import_statements(node.body, scope)
            yield from _import_statements(node.orelse, scope)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _import_statements(block, scope)
        elif isinstance(node, ast.With | ast.For | ast.While | ast.ClassDef) or (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and scope != "module"
        ):  # a class body runs with the module, a function's when it is called
            yield from _import_statements(node.body, scope)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str, path: Path, known: dict[str, Path], scope: str = "module") -> set[str]:
    """The modules of ``known`` that ``module`` imports directly, in ``scope``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    targets: set[str] = set()
    for node in _import_statements(tree.body, scope):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        else:
            base = _absolute(node, module, path.name == "__init__.py")
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    edges = set()
    for target in targets:
        parts = target.split(".")
        for n in range(1, len(parts) + 1):  # p.q.r runs p, then p.q, then p.q.r
            name = ".".join(parts[:n])
            if name in known and name != module and not module.startswith(name + "."):
                edges.add(name)
    return edges


def graph(src: Path, package: str, scope: str = "module") -> dict[str, set[str]]:
    """``module -> the modules it imports`` over every module of ``package``, in ``scope``."""
    known = modules(src, package)
    return {name: imports(name, path, known, scope) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components that hold a cycle, largest first (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges[v]:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found, key=lambda c: (-len(c), c))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=ROOT / "packages/core/src")
    parser.add_argument("--package", default="falconet")
    parser.add_argument("--scope", choices=SCOPES, default="module", help="which imports count")
    parser.add_argument("--edges", action="store_true", help="print each cycle's edges")
    args = parser.parse_args()
    edges = graph(args.src, args.package, args.scope)
    found = cycles(edges)
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} imports ({args.scope} scope)")
    for component in found:
        print(f"cycle of {len(component)} modules:")
        members = set(component)
        for module in component:
            inside = sorted(edges[module] & members)
            print(f"  {module}" + (f" -> {', '.join(inside)}" if args.edges else ""))
    if not found:
        print("no cycle")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
