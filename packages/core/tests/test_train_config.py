"""The training keys: parsing, validation messages, the help listing."""

from __future__ import annotations

import pytest

from falconet.training.config import (
    ConfigError,
    TrainConfig,
    build_config,
    describe_keys,
    parse_cli_pairs,
)


def test_text_values_from_the_command_line_become_typed():
    cfg = build_config(
        parse_cli_pairs(
            ["epochs=3", "nesterov=false", "lr0=1e-3", "device=0", "resume=true", "callbacks=a, b"]
        )
    )
    assert (cfg.epochs, cfg.nesterov, cfg.lr0, cfg.device) == (3, False, 1e-3, "0")
    assert cfg.resume is True and cfg.callbacks == ["a", "b"]
    assert build_config({"resume": "runs/x/weights/last.pt"}).resume == "runs/x/weights/last.pt"


def test_later_layers_win_and_unknown_keys_name_the_closest():
    assert build_config({"epochs": 5}, {"epochs": 7}).epochs == 7
    with pytest.raises(ConfigError, match=r"did you mean batch=\?"):
        build_config({"bacth": 4})
    with pytest.raises(ConfigError, match="is not key=value"):
        parse_cli_pairs(["epochs"])


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"imgsz": 100}, "imgsz=100: must be a multiple of 32 (the network's largest stride)"),
        ({"schedule": "step"}, "schedule='step': expected 'linear' or 'cosine'"),
        ({"batch": 0}, "batch=0: Input should be greater than or equal to 1"),
        ({"mosaic": 2}, "mosaic=2: Input should be less than or equal to 1"),
    ],
)
def test_bad_values_say_what_is_allowed(keys, message):
    with pytest.raises(ConfigError) as info:
        build_config(keys)
    assert message in str(info.value)


def test_every_key_is_described():
    rows = describe_keys()
    assert [r[0] for r in rows] == list(TrainConfig.model_fields)
    assert all(meaning for _, _, meaning in rows)
