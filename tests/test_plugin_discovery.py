"""End to end: installed distributions discovered through their real ``falconet`` entry points.

``falconet-example-plugin`` is installed in the test environment (the workspace's dev group);
``falconet-broken-plugin`` is installed into a temporary site folder (see conftest.py) that
these tests put on ``PYTHONPATH``, each of its four entry points failing at a different stage.
"""

from __future__ import annotations

import json

import pytest

from falconet.plugins import PluginLoadError, Plugins
from falconet_testing.contracts import PluginContract

BROKEN = {
    "broken-import": (
        "import",
        "ModuleNotFoundError",
        "No module named 'falconet_dependency_that_is_not_installed'",
    ),
    "duplicate-name": (
        "register",
        "DuplicateNameError",
        "graph backend 'eager' is registered by both falconet-core",
    ),
    "misspelled-hook": (
        "validate",
        "PluginValidationError",
        "unknown hook 'register_familes'; did you mean 'register_families'?",
    ),
    "raises-in-register": ("register", "RuntimeError", "assigner table is corrupt"),
}


class TestExamplePluginContract(PluginContract):
    """A third-party plugin runs the same contract suite falconet's plugins do."""

    plugin = "falconet_example_plugin"
    distribution = "falconet-example-plugin"


def test_installed_plugin_is_discovered(installed_falconet_plugins):
    plugins = installed_falconet_plugins
    record = next(r for r in plugins.records if r.name == "example")
    assert (record.distribution, record.version, record.status) == (
        "falconet-example-plugin",
        "0.3.1",
        "ok",
    )
    assert record.entry_point == "example = falconet_example_plugin"
    assert plugins.graph_backends.entry("example-counting").provenance.distribution == (
        "falconet-example-plugin"
    )
    assert "example-steps" in plugins.callbacks and "example-hello" in plugins.commands


def test_the_example_backend_is_chosen_by_name_only(installed_falconet_plugins):
    """``priority = None``: ``graph=auto`` never picks it; its callback is never added
    unless ``callbacks=`` names it."""
    from falconet.training.backends import auto_order
    from falconet.training.config import config_model
    from falconet.training.planning import callback_names

    plugins = installed_falconet_plugins
    assert plugins.graph_backends.get("example-counting").priority is None
    assert "example-counting" not in auto_order(plugins)
    config = config_model(plugins)()
    assert "example-steps" not in callback_names(config, plugins)
    named = config.model_copy(update={"callbacks": ["example-steps"]})
    assert callback_names(named, plugins)[-1] == "example-steps"


def test_plugins_list_shows_installed_plugins_with_their_hooks(falconet_cli):
    result = falconet_cli("plugins", "list", "--check")
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    assert [
        "falconet-example-plugin",
        "0.3.1",
        "example",
        "ok",
        "register_callbacks",
        "example-steps",
    ] in rows
    assert ["register_commands", "example-hello"] in rows
    assert ["register_graph_backends", "example-counting"] in rows


def test_plugin_command_runs(falconet_cli):
    result = falconet_cli("example-hello", "falcon")
    assert (result.returncode, result.stdout) == (
        0,
        "hello, falcon, from falconet-example-plugin\n",
    )


def test_broken_plugins_are_reported_and_everything_else_works(falconet_cli, broken_plugin_site):
    report = json.loads(falconet_cli("plugins", "list", "--json", site=broken_plugin_site).stdout)
    by_name = {p["name"]: p for p in report["plugins"]}
    for name, (stage, error_type, message) in BROKEN.items():
        plugin = by_name[name]
        assert (plugin["distribution"], plugin["status"]) == ("falconet-broken-plugin", "broken")
        assert (plugin["error"]["stage"], plugin["error"]["type"]) == (stage, error_type)
        assert message in plugin["error"]["message"]
    assert by_name["example"]["status"] == "ok"
    builtin_graphs = by_name["falconet.builtin"]["registered"]["graph_backends"]
    assert [g["name"] for g in builtin_graphs] == ["compile", "eager"]

    table = falconet_cli("plugins", "list", site=broken_plugin_site)
    assert table.returncode == 0
    rows = [line.split() for line in table.stdout.splitlines()]
    assert [
        "falconet-broken-plugin",
        "0.0.1",
        "broken-import",
        "broken",
        "error",
        "at",
        "import",
        "ModuleNotFoundError:",
        "No",
        "module",
        "named",
        "'falconet_dependency_that_is_not_installed'",
    ] in rows
    assert f"{len(report['plugins'])} plugins, 4 broken" in table.stdout
    assert falconet_cli("plugins", "list", "--check", site=broken_plugin_site).returncode == 1
    # every other command keeps working
    hello = falconet_cli("example-hello", site=broken_plugin_site)
    assert hello.stdout == "hello, world, from falconet-example-plugin\n"
    version = falconet_cli("--version", site=broken_plugin_site).stdout.splitlines()
    assert "falconet-broken-plugin 0.0.1 (4 broken)" in version


def test_strict_mode_stops_at_the_first_broken_plugin(falconet_cli, broken_plugin_site):
    result = falconet_cli(
        "plugins", "list", site=broken_plugin_site, env={"FALCONET_STRICT_PLUGINS": "1"}
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(
        "error: plugin 'broken-import' from falconet-broken-plugin 0.0.1 failed to import: "
        "ModuleNotFoundError"
    )


def test_strict_mode_through_the_api(broken_plugin_site, monkeypatch):
    monkeypatch.syspath_prepend(str(broken_plugin_site))
    with pytest.raises(PluginLoadError, match="broken-import"):
        Plugins(env={"FALCONET_STRICT_PLUGINS": "1"}).load()


def test_disable_list_skips_plugins_by_entry_point_or_distribution(
    falconet_cli, broken_plugin_site
):
    disable = {"FALCONET_DISABLE_PLUGINS": "falconet-broken-plugin, example"}
    result = falconet_cli(
        "plugins", "list", "--check", "--json", site=broken_plugin_site, env=disable
    )
    assert result.returncode == 0, result.stdout
    statuses = {p["name"]: p["status"] for p in json.loads(result.stdout)["plugins"]}
    disabled = {"example", *BROKEN}
    assert {name for name, status in statuses.items() if status == "disabled"} == disabled
    assert all(status == "ok" for name, status in statuses.items() if name not in disabled)
    assert "falconet.builtin" in statuses
    assert falconet_cli("example-hello", env=disable).returncode == 2  # no such command now


def test_asking_for_what_a_disabled_plugin_provides_says_so(monkeypatch):
    plugins = Plugins(env={"FALCONET_DISABLE_PLUGINS": "example"}).load()
    with pytest.raises(LookupError) as err:
        plugins.graph_backends.get("example-counting")
    assert "Plugins not loaded may provide it: example (falconet-example-plugin, disabled)" in (
        str(err.value)
    )


def test_duplicate_between_installed_plugins_keeps_the_first(broken_plugin_site, monkeypatch):
    monkeypatch.syspath_prepend(str(broken_plugin_site))
    plugins = Plugins(env={}).load()
    assert plugins.graph_backends.entry("eager").provenance.distribution == "falconet-core"
    assert "shadow-eager" not in plugins.graph_backends  # rolled back with its plugin
