"""Which layers fp8 takes and how the measurement decides (CPU: no Transformer Engine needed)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from falconet_precision_te_fp8.eligibility import linear_layers
from falconet_precision_te_fp8.gating import (
    Product,
    Timing,
    TimingCache,
    choose,
    layer_rows,
    products,
)


class Scaled(nn.Linear):
    """A subclass that does more than a product: never converted."""

    def forward(self, x):
        return super().forward(x) * 2


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 64, 3)
        self.big = nn.Linear(64, 256)
        self.odd = nn.Linear(256, 130)
        self.small = nn.Linear(130, 32)
        self.scaled = Scaled(32, 64)
        self.unused = nn.Linear(64, 64)

    def forward(self, images):
        tokens = self.conv(images).flatten(2).transpose(1, 2)  # [B, HW, 64]
        return self.scaled(self.small(self.odd(self.big(tokens))))


def test_only_plain_linears_with_aligned_large_enough_features_are_eligible():
    layers = {x.name: x for x in linear_layers(Net(), min_dim=64)}
    assert set(layers) == {"big", "odd", "small", "unused"}  # no conv, no subclass
    assert layers["big"].skipped is None and layers["unused"].skipped is None
    assert "multiples of 16" in layers["odd"].skipped
    assert "130 -> 32" in layers["small"].skipped  # 130 is not aligned either
    assert linear_layers(nn.Sequential(nn.Linear(32, 48)), 64)[0].skipped == (
        "features 32 -> 48 under fp8_min_dim=64"
    )


def test_the_probe_forward_records_each_layers_rows():
    model = Net()
    layers = linear_layers(model, 64)
    rows = layer_rows(model, [x.name for x in layers], torch.zeros(2, 3, 6, 6))
    assert rows == {"big": 2 * 16, "odd": 2 * 16, "small": 2 * 16}  # 4 x 4 cells, 2 images
    assert products(layers, rows) == [Product(32, 64, 256)]  # only "big" is eligible and used


def test_the_probe_forward_leaves_the_running_statistics_as_it_found_them():
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.Flatten(2))
    model.append(Transposed()).append(nn.Linear(16, 64)).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows = layer_rows(model, ["4"], torch.randn(2, 3, 6, 6) + 5)  # a training forward
    assert rows == {"4": 2 * 16}
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # running mean/var, count


class Transposed(nn.Module):
    def forward(self, x):
        return x.transpose(1, 2)


def test_a_layer_converts_only_where_fp8_measured_faster_by_the_margin():
    model = Net()
    layers = linear_layers(model, 16)
    rows = {"big": 4096, "odd": 4096, "small": 4096}
    timings = {
        Product(4096, 64, 256).key: Timing(bf16_ms=1.0, fp8_ms=0.5),
        Product(4096, 256, 130).key: Timing(bf16_ms=1.0, fp8_ms=0.2),
        Product(4096, 130, 32).key: Timing(bf16_ms=1.0, fp8_ms=0.2),
    }
    decided = choose(layers, rows, timings, force=False)
    assert decided["big"] is None
    assert "multiples of 16" in decided["odd"]  # eligibility first, whatever the timing
    assert decided["unused"] == "not used by the training forward"
    tie = {Product(4096, 64, 256).key: Timing(bf16_ms=1.0, fp8_ms=0.97)}
    assert "fp8 0.970 ms, bf16 1.000 ms" in choose(layers[:1], rows, tie, force=False)["big"]
    forced = choose(layers, rows, {}, force=True)  # fp8_layers=all: no timing needed
    assert forced["big"] is None and forced["odd"] is not None


def test_timings_are_measured_once_and_read_back_from_the_cache(tmp_path):
    path = tmp_path / "fp8.json"
    measured = []

    def timer(product):
        measured.append(product)
        return Timing(bf16_ms=product.rows / 1000, fp8_ms=product.rows / 2000)

    wanted = [Product(256, 64, 64), Product(512, 64, 128)]
    first = TimingCache(path).measure(wanted, timer)
    assert measured == wanted and first[wanted[1].key].speedup == pytest.approx(2.0)
    again = TimingCache(path).measure(wanted, timer)
    assert measured == wanted and again == first  # nothing measured twice
    assert set(json.loads(path.read_text())) == {p.key for p in wanted}


def test_a_torn_cache_file_is_measured_again(tmp_path, caplog):
    path = tmp_path / "fp8.json"
    path.write_text('{"256x64x64": {"bf16_ms"')
    timings = TimingCache(path).measure([Product(256, 64, 64)], lambda p: Timing(1.0, 0.5))
    assert timings["256x64x64"] == Timing(1.0, 0.5)
    assert "ignoring the timing cache" in caplog.text


def test_replayed_and_launched_timings_are_cached_apart(tmp_path, monkeypatch):
    """The two ways of timing a product give different numbers: a run never reads the other's."""
    monkeypatch.setenv("FALCONET_CACHE_DIR", str(tmp_path))
    replayed = TimingCache.for_run("NVIDIA H200", "2.20.2", "current", replayed=True)
    launched = TimingCache.for_run("NVIDIA H200", "2.20.2", "current", replayed=False)
    assert replayed.path != launched.path and replayed.path.parent == tmp_path
    replayed.measure([Product(256, 64, 64)], lambda p: Timing(1.0, 0.5, replayed=True))
    assert TimingCache(replayed.path).entries["256x64x64"].replayed
    assert not TimingCache(launched.path).entries
    reason = choose(
        linear_layers(Net(), 16)[:1],
        {"big": 4096},
        {Product(4096, 64, 256).key: Timing(1.0, 1.0, replayed=True)},
        force=False,
    )["big"]
    assert reason.endswith("at 4096 rows (replayed)")
