"""The plugin manager, through its API, with temporary plugins (no installed entry points).

End-to-end discovery of installed distributions is tested in the repository's tests/.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from falconet import hookspecs
from falconet.graph_backends.eager import EagerBackend
from falconet.plugins import PluginLoadError, Plugins, get_plugins, reset_plugins
from falconet.registry import UnknownNameError


class Named(EagerBackend):
    def __init__(self, name: str) -> None:
        self.name = name


def graph_plugin(*names: str) -> SimpleNamespace:
    return SimpleNamespace(
        register_graph_backends=lambda register: [register(Named(n)) for n in names]
    )


def test_builtins_register_through_the_manager(falconet_plugins):
    assert falconet_plugins.precision_backends.names() == ["bf16", "fp16", "fp32"]
    assert falconet_plugins.graph_backends.names() == ["compile", "eager"]
    assert falconet_plugins.eval_backends.names() == ["pycocotools"]
    # the core's loggers are registered callbacks like any plugin's, and compile_mode is the
    # built-in compile backend's own key group (grad_checkpoint the core's, read by families)
    assert falconet_plugins.callbacks.names() == ["csv", "plots", "progress", "tensorboard"]
    assert falconet_plugins.train_keys.names() == ["compile", "grad-checkpoint"]
    assert list(falconet_plugins.train_keys.get("compile").keys.model_fields) == ["compile_mode"]
    commands = ["data", "eval", "export", "plugins", "predict", "train", "val"]
    assert falconet_plugins.commands.names() == commands
    (record,) = falconet_plugins.records
    assert (record.name, record.distribution, record.status) == (
        "falconet.builtin",
        "falconet-core",
        "ok",
    )
    assert record.hooks == [
        "register_callbacks",
        "register_commands",
        "register_eval_backends",
        "register_graph_backends",
        "register_levers",
        "register_precision_backends",
        "register_train_keys",
    ]
    assert falconet_plugins.graph_backends.entry("eager").provenance.distribution == "falconet-core"


def test_items_are_attributed_to_their_distribution(falconet_plugins, add_falconet_plugin):
    record = add_falconet_plugin(
        graph_plugin("fast", "faster"), name="acme", distribution="acme-graphs", version="1.2"
    )
    assert record.status == "ok"
    assert record.hooks == ["register_graph_backends"]
    entry = falconet_plugins.graph_backends.entry("faster")
    assert (entry.provenance.distribution, entry.provenance.version) == ("acme-graphs", "1.2")
    assert [e.name for e in falconet_plugins.registered_by("acme")["graph_backends"]] == [
        "fast",
        "faster",
    ]


def test_a_raising_hook_is_recorded_and_rolled_back(falconet_plugins, add_falconet_plugin):
    def register_graph_backends(register):
        register(Named("half-registered"))
        raise RuntimeError("table is corrupt")

    plugin = SimpleNamespace(register_graph_backends=register_graph_backends)
    record = add_falconet_plugin(plugin, name="flaky")
    assert record.status == "broken"
    assert (record.failure.stage, record.failure.summary) == (
        "register",
        "RuntimeError: table is corrupt",
    )
    assert "half-registered" not in falconet_plugins.graph_backends
    assert not any(p is plugin for p in falconet_plugins.pm.get_plugins())
    # the manager keeps working for everyone else
    assert add_falconet_plugin(graph_plugin("after"), name="later").status == "ok"


def test_misspelled_hook_is_caught_with_a_suggestion(add_falconet_plugin, falconet_plugins):
    record = add_falconet_plugin(SimpleNamespace(register_familes=lambda register: None))
    assert record.status == "broken"
    assert record.failure.stage == "validate"
    assert "unknown hook 'register_familes'" in record.failure.message
    assert "did you mean 'register_families'?" in record.failure.message
    # the unknown hook does not poison later plugins' validation
    assert add_falconet_plugin(graph_plugin("ok")).status == "ok"


def test_hook_with_a_wrong_argument_name_is_refused(add_falconet_plugin):
    record = add_falconet_plugin(SimpleNamespace(register_graph_backends=lambda registry: None))
    assert record.status == "broken"
    assert record.failure.stage == "validate"
    assert "registry" in record.failure.message


def test_duplicate_name_breaks_the_second_plugin_only(falconet_plugins, add_falconet_plugin):
    record = add_falconet_plugin(
        graph_plugin("mine", "eager"), name="clash", distribution="clash-dist", version="3"
    )
    assert record.status == "broken"
    assert "falconet-core" in record.failure.message and "clash-dist 3" in record.failure.message
    assert falconet_plugins.graph_backends.entry("eager").provenance.distribution == "falconet-core"
    assert "mine" not in falconet_plugins.graph_backends


def test_strict_mode_makes_a_failure_fatal():
    plugins = Plugins(env={"FALCONET_STRICT_PLUGINS": "1"}).load_builtins()
    with pytest.raises(PluginLoadError) as err:
        plugins.add_plugin(
            SimpleNamespace(register_familes=lambda register: None), "typo", "typo-dist", "1.0"
        )
    message = str(err.value)
    assert "plugin 'typo' from typo-dist 1.0 failed to validate" in message
    assert "FALCONET_DISABLE_PLUGINS=typo" in message


def test_unknown_first_party_name_gives_the_install_command(falconet_plugins):
    with pytest.raises(UnknownNameError) as err:
        falconet_plugins.graph_backends.get("cuda-graph")
    assert "graph=cuda-graph needs: pip install falconet-graphs-cuda" in str(err.value)
    assert "Available: compile, eager." in str(err.value)


def test_unknown_name_from_a_broken_provider_says_it_is_broken(
    falconet_plugins, add_falconet_plugin
):
    def register_graph_backends(register):
        raise ImportError("libcuda.so.1: cannot open shared object file")

    add_falconet_plugin(
        SimpleNamespace(register_graph_backends=register_graph_backends),
        name="graphs",
        distribution="falconet-graphs-cuda",
    )
    with pytest.raises(UnknownNameError) as err:
        falconet_plugins.graph_backends.get("cuda-graph")
    assert "falconet-graphs-cuda is installed but failed to load: ImportError: libcuda.so.1" in str(
        err.value
    )


def test_get_plugins_loads_once_and_resets():
    reset_plugins()
    first = get_plugins()
    assert get_plugins() is first
    reset_plugins()
    assert get_plugins() is not first
    reset_plugins()


@pytest.mark.parametrize("name", [n for n in dir(hookspecs) if n.startswith("register_")])
def test_every_hookspec_follows_the_docstring_template(name):
    spec = getattr(hookspecs, name)
    assert list(inspect.signature(spec).parameters) == ["register"]
    doc = inspect.getdoc(spec)
    assert doc.startswith("Register ")
    assert ":param register: call ``register(" in doc
    assert "Called once when the plugins are loaded" in doc
    assert "The return value is ignored." in doc
