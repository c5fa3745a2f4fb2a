"""What every falconet plugin must do, whatever it registers."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import json
import subprocess
import sys
import textwrap
from typing import Any, ClassVar

from falconet import builtin
from falconet.plugins import BUILTIN_PLUGIN, PluginRecord, Plugins
from falconet.registry import Entry


def load_alone(plugin: str, distribution: str) -> tuple[Plugins, PluginRecord]:
    """A fresh manager with falconet's built-ins and ``plugin`` (imported by its path).

    The built-ins are loaded first so a clash with them shows; when ``plugin`` *is* the built-in
    plugin it is the only one loaded.
    """
    obj = importlib.import_module(plugin)
    plugins = Plugins(env={})
    if obj is builtin:
        return plugins, plugins.add_plugin(obj, BUILTIN_PLUGIN, distribution)
    plugins.load_builtins()
    return plugins, plugins.add_plugin(obj, f"contract:{plugin}", distribution)


class PluginContract:
    """Subclass with ``plugin`` (import path of the plugin object) and ``distribution``.

    ``heavy_modules`` are modules that loading and registering the plugin must not import, so
    ``falconet plugins list`` stays fast on any machine; import them inside your items' methods.
    """

    plugin: ClassVar[str]
    distribution: ClassVar[str]
    heavy_modules: ClassVar[tuple[str, ...]] = (
        "torch",
        "torchvision",
        "transformer_engine",
        "pycocotools",
        "faster_coco_eval",
        "hotcoco",
        "vernier",
        "cv2",
        "scipy",
        "triton",
    )

    def _load(self) -> tuple[PluginRecord, dict[str, list[Entry[Any]]]]:
        """Load the plugin on a fresh manager: its record and what it registered, per kind."""
        plugins, record = load_alone(self.plugin, self.distribution)
        return record, plugins.registered_by(record.name)

    def test_loads_cleanly(self) -> None:
        record, _ = self._load()
        assert record.status == "ok", record.failure and record.failure.traceback

    def test_every_hook_registers_something(self) -> None:
        record, registered = self._load()
        assert record.hooks, f"{self.plugin} implements no register_* hook"
        empty = [h for h in record.hooks if h.removeprefix("register_") not in registered]
        assert not empty, f"hooks that registered nothing: {empty}"

    def test_every_item_has_a_summary(self) -> None:
        _, registered = self._load()
        for kind, entries in registered.items():
            for entry in entries:
                summary = getattr(entry.item, "summary", None) or getattr(entry.item, "help", None)
                assert summary, f"{kind} {entry.name!r} has no summary for `plugins list`"

    def test_loading_imports_nothing_heavy(self) -> None:
        probe = textwrap.dedent(f"""
            import json, sys
            from falconet_testing.contracts.plugin import load_alone
            _, record = load_alone({self.plugin!r}, {self.distribution!r})
            assert record.status == "ok", record.failure
            heavy = {list(self.heavy_modules)!r}
            print(json.dumps([m for m in heavy if m in sys.modules]))
        """)
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        ).stdout
        imported = json.loads(out.strip().splitlines()[-1])
        assert not imported, (
            f"loading {self.plugin} imported {imported}; import them inside "
            f"the registered items' methods instead"
        )

    def test_entry_point_names_this_plugin(self) -> None:
        eps = [
            ep
            for ep in metadata.entry_points(group="falconet")
            if ep.dist is not None and ep.dist.name == self.distribution
        ]
        if self.distribution == "falconet-core":  # the core registers itself, not by entry point
            assert not eps
            return
        assert any(ep.value == self.plugin for ep in eps), (
            f"{self.distribution} declares no entry point `falconet` pointing at {self.plugin}; "
            f"add [project.entry-points.falconet] to its pyproject.toml"
        )
