"""The training keys: parsing, validation messages, the help listing, and keys plugins add."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import BaseModel, Field

from falconet.keys import KeyGroup
from falconet.training.config import (
    CORE,
    ConfigError,
    TrainConfig,
    build_config,
    check_keys,
    config_model,
    describe_keys,
    parse_cli_pairs,
)


def test_text_values_from_the_command_line_become_typed():
    cfg = build_config(
        TrainConfig,
        parse_cli_pairs(
            ["epochs=3", "nesterov=false", "lr0=1e-3", "device=0", "resume=true", "callbacks=a, b"]
        ),
    )
    assert (cfg.epochs, cfg.nesterov, cfg.lr0, cfg.device) == (3, False, 1e-3, "0")
    assert cfg.resume is True and cfg.callbacks == ["a", "b"]
    resumed = build_config(TrainConfig, {"resume": "runs/x/weights/last.pt"})
    assert resumed.resume == "runs/x/weights/last.pt"


def test_later_layers_win_and_unknown_keys_name_the_closest():
    assert build_config(TrainConfig, {"epochs": 5}, {"epochs": 7}).epochs == 7
    with pytest.raises(ConfigError, match=r"did you mean batch=\?"):
        build_config(TrainConfig, {"bacth": 4})
    with pytest.raises(ConfigError, match="is not key=value"):
        parse_cli_pairs(["epochs"])


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"imgsz": 100}, "imgsz=100: must be a multiple of 32 (the network's largest stride)"),
        ({"schedule": "step"}, "schedule='step': expected 'linear' or 'cosine'"),
        ({"batch": 0}, "batch=0: 0 is neither a number of images (1 or more) nor autobatch"),
        ({"mosaic": 2}, "mosaic=2: Input should be less than or equal to 1"),
    ],
)
def test_bad_values_say_what_is_allowed(keys, message):
    with pytest.raises(ConfigError) as info:
        build_config(TrainConfig, keys)
    assert message in str(info.value)


def test_every_key_is_described():
    rows = describe_keys()
    assert [r[0] for r in rows] == list(TrainConfig.model_fields)
    assert all(meaning for _, _, meaning, _ in rows)
    assert {owner for *_, owner in rows} == {CORE}


class WidgetKeys(BaseModel):
    widget_size: int = Field(3, ge=1, description="how big the widget is")
    widget_on: bool = Field(False, description="turn the widget on")


WIDGET = KeyGroup("widget", "the widget's keys", WidgetKeys)


def _with_widget(add_falconet_plugin, falconet_plugins):
    record = add_falconet_plugin(
        SimpleNamespace(register_train_keys=lambda register: register(WIDGET)),
        distribution="acme-widget",
    )
    assert record.status == "ok", record.failure
    return config_model(falconet_plugins)


def test_plugin_keys_are_typed_keys_of_the_run(falconet_plugins, add_falconet_plugin):
    model = _with_widget(add_falconet_plugin, falconet_plugins)
    assert config_model(falconet_plugins) is model  # made once per plugin manager
    cfg = build_config(model, {"epochs": 2}, {"widget_size": "5", "widget_on": "true"})
    assert (cfg.epochs, cfg.widget_size, cfg.widget_on) == (2, 5, True)
    assert build_config(model).widget_size == 3
    with pytest.raises(ConfigError, match="widget_size=0: Input should be greater than"):
        build_config(model, {"widget_size": 0})
    with pytest.raises(ConfigError, match=r"did you mean widget_size=\?"):
        build_config(model, {"widget_sise": 4})
    with pytest.raises(ConfigError, match="unknown key 'widget_size'"):
        check_keys({"widget_size": 4})  # the core's keys alone do not have it


def test_plugin_keys_are_described_with_their_owner(falconet_plugins, add_falconet_plugin):
    rows = describe_keys(_with_widget(add_falconet_plugin, falconet_plugins))
    core = [r for r in rows if r[3] == CORE]
    assert [r[0] for r in rows[: len(core)]] == [r[0] for r in core]  # the core's first
    assert "compile_mode" in [r[0] for r in core]  # the built-in compile backend's key group
    assert rows[-2:] == [
        ("widget_size", "3", "how big the widget is", "acme-widget"),
        ("widget_on", "false", "turn the widget on", "acme-widget"),
    ]


def test_a_key_declared_twice_names_both_owners(falconet_plugins, add_falconet_plugin):
    class Clash(BaseModel):
        epochs: int = Field(1, description="a second epochs")

    clash = KeyGroup("clash", "clashes", Clash)
    record = add_falconet_plugin(
        SimpleNamespace(register_train_keys=lambda register: register(clash)),
        distribution="acme-clash",
    )
    assert record.status == "ok"  # registering is fine: the clash shows when keys are merged
    with pytest.raises(ConfigError) as info:
        config_model(falconet_plugins)
    message = str(info.value)
    assert "'epochs' is declared by both falconet-core and acme-clash" in message


@pytest.mark.parametrize(
    ("key", "distribution"),
    [
        ("fuse", "falconet-graphs-cuda"),
        ("bn_silu", "falconet-graphs-cuda"),
        ("profile", "falconet-profiler"),
        ("profile_steps", "falconet-profiler"),
    ],
)
def test_a_key_of_a_plugin_not_installed_names_its_distribution(
    falconet_plugins, key, distribution
):
    with pytest.raises(ConfigError) as info:
        build_config(config_model(falconet_plugins), {key: "1"})
    assert str(info.value) == (
        f"unknown key {key!r}: it is a key of {distribution}, which is not installed; "
        f"pip install {distribution}"
    )


def test_a_key_group_must_be_a_pydantic_model():
    with pytest.raises(TypeError, match="must be a pydantic BaseModel subclass"):
        KeyGroup("bad", "not a model", dict)


def test_the_installed_plugins_keys_are_described_with_their_distribution(
    installed_falconet_plugins,
):
    """Every first-party key the install hints name is, when its plugin is installed, declared by
    that distribution (graphs-cuda's ``fuse``, ``wgrad_stream``, ``bn_silu``; the profiler's
    ``profile*``), never by the core."""
    from falconet.install_hints import install_hints

    owners = {
        key: owner for key, *_, owner in describe_keys(config_model(installed_falconet_plugins))
    }
    installed = {r.distribution for r in installed_falconet_plugins.records if r.status == "ok"}
    checked = 0
    for key, distribution in install_hints()["train_keys"].items():
        assert key not in TrainConfig.model_fields, key
        if distribution in installed:
            assert owners[key] == distribution, key
            checked += 1
    if not checked:  # pragma: no cover
        pytest.skip("neither falconet-graphs-cuda nor falconet-profiler is installed")
    assert owners["compile_mode"] == CORE  # the built-in compile backend's key group
