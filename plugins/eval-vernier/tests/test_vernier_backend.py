"""The vernier backend: parity with pycocotools, plugin contract, missing library."""

from __future__ import annotations

import sys

import pytest

from falconet.evaluation import Detections, EvalBackendUnavailable
from falconet_eval_vernier.backend import VernierBackend
from falconet_testing.contracts import EvalBackendContract, PluginContract
from falconet_testing.eval_cases import coco128_ground_truth


class TestVernierParity(EvalBackendContract):
    backend = VernierBackend()


class TestVernierPlugin(PluginContract):
    plugin = "falconet_eval_vernier"
    distribution = "falconet-eval-vernier"
    heavy_modules = (*PluginContract.heavy_modules, "pyarrow")


def test_missing_library_gives_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "vernier.instance", None)  # as if it were not installed
    with pytest.raises(EvalBackendUnavailable, match="pip install vernier"):
        VernierBackend().evaluate(coco128_ground_truth(), Detections.empty())
