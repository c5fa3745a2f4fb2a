"""``augment=``: a preset sets the augmentation keys between the family's recipe and the keys a
run names, and the CPU and GPU paths train with the same ones."""

from __future__ import annotations

import pytest
import torch

from falconet.data.gpu_cache import fill_store
from falconet.data.resolve import load_dataset
from falconet.data.shapes import write_shapes
from falconet.data.transforms import AugmentConfig
from falconet.plugins import Plugins
from falconet.training.augment_presets import PRESETS
from falconet.training.config import ConfigError
from falconet.training.loaders import build_loaders, train_samples
from falconet.training.planning import plan_run

FIELDS = ("mosaic", "degrees", "translate", "shear", "scale", "hsv_h", "hsv_s", "hsv_v", "fliplr")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FALCONET_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def plugins():
    return Plugins().load()


@pytest.fixture
def data(tmp_path):
    return str(write_shapes(tmp_path / "shapes", {"train": 8, "val": 2}, size=64))


def config(plugins, data, **keys):
    return plan_run({"data": data, "imgsz": 64, "device": "cpu", **keys}, plugins).config


def test_presets_set_the_keys_and_named_keys_win(plugins, data):
    default = config(plugins, data)
    assert config(plugins, data, augment="default") == default
    off = config(plugins, data, augment="false")
    assert off.augment == "none"
    assert all(getattr(off, k) == 0 for k in FIELDS) and off.close_mosaic == 0
    light = config(plugins, data, augment="light", mosaic=0.2)
    assert light.mosaic == 0.2 and light.scale == PRESETS["light"]["scale"]
    heavy = config(plugins, data, augment="heavy")
    assert heavy.degrees == 10 and heavy.scale > default.scale
    with pytest.raises(ConfigError, match="augment='strong': expected one of default, none"):
        config(plugins, data, augment="strong")


def test_the_cpu_and_the_gpu_path_train_with_the_presets_keys(plugins, data):
    cfg = config(plugins, data, augment="light", cache="ram", workers=0, val=False)
    dataset = load_dataset(data)
    cpu, _ = build_loaders(cfg, dataset, torch.device("cpu"))
    filled = fill_store(train_samples(cfg, dataset), cfg.imgsz, torch.device("cpu"))
    gpu, _ = build_loaders(cfg, dataset, torch.device("cpu"), gpu_cache=filled)
    expected = AugmentConfig(**{k: PRESETS["light"][k] for k in FIELDS})
    assert cpu.dataset.augment == gpu.dataset.augment == expected
