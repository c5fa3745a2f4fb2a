"""``falconet --version`` and ``falconet plugins list`` on a manager the test controls."""

from __future__ import annotations

import json
from types import SimpleNamespace

import click
from click.testing import CliRunner

from falconet import __version__
from falconet.cli import build_cli
from falconet.graph_backends.eager import EagerBackend


def invoke(plugins, *args):
    return CliRunner().invoke(build_cli(plugins), list(args), obj=plugins)


def test_version_lists_falconet_and_plugin_distributions(falconet_plugins, add_falconet_plugin):
    add_falconet_plugin(
        SimpleNamespace(register_familes=lambda register: None),
        distribution="typo-dist",
        version="9.9",
    )
    result = invoke(falconet_plugins, "--version")
    assert result.exit_code == 0
    assert result.output.splitlines() == [f"falconet {__version__}", "typo-dist 9.9 (1 broken)"]


def test_plugins_list_table_shows_hooks_and_names(falconet_plugins):
    result = invoke(falconet_plugins, "plugins", "list")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["DISTRIBUTION", "VERSION", "PLUGIN", "STATUS", "HOOK", "REGISTERED"]
    assert lines[1].split() == [
        "falconet-core",
        __version__,
        "falconet.builtin",
        "ok",
        "register_callbacks",
        "csv,",
        "plots,",
        "progress,",
        "tensorboard",
    ]
    assert [line.split() for line in lines[2:8]] == [
        ["register_commands", "data,", "eval,", "export,", "plugins,", "predict,", "train,", "val"],
        ["register_eval_backends", "pycocotools"],
        ["register_graph_backends", "compile,", "eager"],
        [
            "register_levers",
            *"amp-bf16, amp-fp16, batch-down, batch-up, cache, compile,".split(),
            "workers",
        ],
        ["register_precision_backends", "bf16,", "fp16,", "fp32"],
        ["register_train_keys", "compile,", "grad-checkpoint"],
    ]
    assert lines[-1] == f"falconet {__version__}: 1 plugins, 0 broken"


def test_plugins_list_json_schema(falconet_plugins, add_falconet_plugin):
    class Fast(EagerBackend):
        name, summary = "fast", "goes fast"

    add_falconet_plugin(
        SimpleNamespace(register_graph_backends=lambda register: register(Fast())),
        name="acme",
        distribution="acme-graphs",
        version="1.0",
    )
    add_falconet_plugin(
        SimpleNamespace(register_assigners=lambda register: 1 / 0),
        name="bad",
        distribution="bad-dist",
    )
    result = invoke(falconet_plugins, "plugins", "list", "--json")
    assert result.exit_code == 0
    report = json.loads(result.output)
    assert report["schema_version"] == 1 and report["falconet_version"] == __version__
    acme, bad = report["plugins"][1:]
    assert acme == {
        "name": "acme",
        "distribution": "acme-graphs",
        "version": "1.0",
        "entry_point": "acme",
        "status": "ok",
        "hooks": ["register_graph_backends"],
        "registered": {"graph_backends": [{"name": "fast", "aliases": [], "summary": "goes fast"}]},
        "error": None,
    }
    assert bad["status"] == "broken" and bad["registered"] == {}
    assert bad["error"]["stage"] == "register"
    assert bad["error"]["type"] == "ZeroDivisionError"
    assert "1 / 0" in bad["error"]["traceback"]


def test_check_fails_only_when_a_plugin_is_broken(falconet_plugins, add_falconet_plugin):
    assert invoke(falconet_plugins, "plugins", "list", "--check").exit_code == 0
    add_falconet_plugin(SimpleNamespace(register_familes=lambda register: None))
    result = invoke(falconet_plugins, "plugins", "list", "--check")
    assert result.exit_code == 1
    assert "error at validate" in result.output


def test_plugin_commands_are_attached(falconet_plugins, add_falconet_plugin):
    @click.command("hello")
    def hello():
        """Greet."""
        click.echo("hi")

    add_falconet_plugin(SimpleNamespace(register_commands=lambda register: register(hello)))
    assert invoke(falconet_plugins, "hello").output == "hi\n"
    assert "hello" in invoke(falconet_plugins, "--help").output


def test_a_plugin_cannot_take_a_core_command_name(falconet_plugins, add_falconet_plugin):
    @click.command("plugins")
    def impostor():
        """Shadow the core's command."""

    record = add_falconet_plugin(
        SimpleNamespace(register_commands=lambda register: register(impostor))
    )
    assert record.status == "broken"
    assert "command 'plugins' is registered by both falconet-core" in record.failure.message
