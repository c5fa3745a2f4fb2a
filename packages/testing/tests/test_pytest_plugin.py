"""The fixtures a plugin author gets by installing falconet-testing."""

from __future__ import annotations

from types import SimpleNamespace


def test_fresh_manager_holds_builtins_only(falconet_plugins):
    assert [r.name for r in falconet_plugins.records] == ["falconet.builtin"]
    assert "example-counting" not in falconet_plugins.graph_backends


def test_installed_manager_discovers_entry_points(installed_falconet_plugins):
    assert "example" in [r.name for r in installed_falconet_plugins.records]


def test_add_plugin_registers_on_the_fresh_manager(falconet_plugins, add_falconet_plugin):
    class Steps:
        name, summary = "steps", "count steps"

        def wanted(self, config):
            return False

        def __call__(self, **options):
            return self

    record = add_falconet_plugin(
        SimpleNamespace(register_callbacks=lambda register: register(Steps())),
        distribution="my-plugin",
    )
    assert record.status == "ok"
    assert falconet_plugins.callbacks.entry("steps").provenance.distribution == "my-plugin"


def test_the_fixtures_reach_a_third_party_test_suite(pytester):
    """A plugin author's test file gets the fixtures and contract suites with no conftest."""
    pytester.makepyfile(
        test_author="""
        from types import SimpleNamespace
        from falconet_testing.contracts import PluginContract

        class TestExample(PluginContract):
            plugin = "falconet_example_plugin"
            distribution = "falconet-example-plugin"

        def test_temporary(add_falconet_plugin):
            record = add_falconet_plugin(SimpleNamespace(register_familes=lambda register: 0))
            assert record.status == "broken"
    """
    )
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)
