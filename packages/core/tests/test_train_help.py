"""``falconet train --help`` fits the terminal: every key's meaning wrapped under its column."""

from __future__ import annotations

from click.testing import CliRunner

from falconet.cli.train_command import train


def test_train_help_wraps_every_line_to_the_terminal():
    for width in (80, 120):
        text = CliRunner().invoke(train, ["--help"], terminal_width=width).output
        assert "Keys (KEY=VALUE; default, meaning):" in text and "threads" in text
        longest = max(text.splitlines(), key=len)
        assert len(longest) <= width, longest
    # a meaning's continuation lines sit under its column, never under the key's
    lines = CliRunner().invoke(train, ["--help"], terminal_width=80).output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  batch "))
    assert lines[at + 1].startswith(" " * 36) and lines[at + 1][36] != " "


def test_train_help_lists_what_this_installation_accepts():
    """Registry-backed keys list the names installed plugins registered; the device key says
    a list of GPUs is accepted."""
    from falconet.plugins import get_plugins

    plugins = get_plugins()
    text = " ".join(CliRunner().invoke(train, ["--help"], terminal_width=200).output.split())
    precisions = ", ".join(sorted(plugins.precision_backends.names()))
    assert f"installed: {precisions}" in text
    assert f"installed: {', '.join(sorted(plugins.graph_backends.names()))}" in text
    assert "a list of GPUs 0,1" in text


def test_a_plugin_s_precision_shows_among_the_installed():
    """What the help lists comes from the registries: a precision a plugin registers (as
    falconet-precision-te-fp8 registers fp8) appears, under amp_dtype."""
    from types import SimpleNamespace

    from falconet.cli.train_command import _installed_names
    from falconet.plugins import Plugins
    from falconet.precision import AutocastPrecision

    plugins = Plugins().load()
    extra = AutocastPrecision("fp-test", "a test plugin's precision", dtype=None)
    plugin = SimpleNamespace(register_precision_backends=lambda register: register(extra))
    before = _installed_names(plugins)["amp_dtype"]
    assert plugins.add_plugin(plugin, "test-precision", "test").status == "ok"
    after = _installed_names(plugins)["amp_dtype"].split(", ")
    assert "fp-test" in after and "fp-test" not in before.split(", ")
