"""The hotcoco backend: parity with pycocotools, plugin contract, missing library, threads."""

from __future__ import annotations

import sys

import pytest

from falconet.evaluation import Detections, EvalBackendUnavailable
from falconet.evaluation.evaluate import default_backend_name
from falconet_eval_hotcoco.backend import HotcocoBackend
from falconet_testing.contracts import EvalBackendContract, PluginContract
from falconet_testing.eval_cases import coco128_ground_truth


class TestHotcocoParity(EvalBackendContract):
    backend = HotcocoBackend()


class TestHotcocoPlugin(PluginContract):
    plugin = "falconet_eval_hotcoco"
    distribution = "falconet-eval-hotcoco"


def test_missing_library_gives_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "hotcoco", None)  # what an absent package looks like
    with pytest.raises(EvalBackendUnavailable, match="pip install hotcoco"):
        HotcocoBackend().evaluate(coco128_ground_truth(), Detections.empty())


def test_a_later_thread_count_is_reported_not_silently_applied(caplog):
    backend, gt = HotcocoBackend(), coco128_ground_truth()
    backend.evaluate(gt, Detections.empty(), threads=None)  # fixes the count, if not yet fixed
    backend.evaluate(gt, Detections.empty(), threads=97)
    assert "threads=97 ignored: rayon fixed the thread count" in caplog.text


def test_default_backend_skips_hotcoco_when_its_library_is_missing(
    monkeypatch, installed_falconet_plugins
):
    # eval_backend=auto goes by priority: hotcoco, then vernier, then the reference
    priorities = {
        e.name: e.item.priority for e in installed_falconet_plugins.eval_backends.entries()
    }
    assert priorities["hotcoco"] > priorities["vernier"] > priorities["pycocotools"] == 0
    assert default_backend_name(installed_falconet_plugins) == "hotcoco"
    monkeypatch.setitem(sys.modules, "hotcoco", None)
    assert default_backend_name(installed_falconet_plugins) == "vernier"
