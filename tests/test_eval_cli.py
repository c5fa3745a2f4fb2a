"""End to end: ``falconet eval`` gives pycocotools' numbers with every installed backend, on the
real COCO128 instances file (segmentations, crowd regions and all)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from falconet.evaluation.coco_json import save_results
from falconet.evaluation.contract import STAT_KEYS
from falconet_testing.eval_cases import coco128_ground_truth, generated_detections

COCO128_JSON = (
    Path(__file__).parents[2] / "shared/data/coco128/annotations" / "instances_train2017.json"
)
pytestmark = pytest.mark.skipif(
    not COCO128_JSON.exists(), reason=f"needs the shared COCO128 data at {COCO128_JSON}"
)


@pytest.fixture(scope="module")
def results_file(tmp_path_factory) -> Path:
    dets = generated_detections(coco128_ground_truth(), seed=21)
    return save_results(dets, tmp_path_factory.mktemp("eval") / "results.json")


@pytest.fixture(scope="module")
def pycocotools_stats(results_file) -> list[float]:
    """pycocotools used the usual way, on the files themselves."""
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(COCO128_JSON))
        evaluator = COCOeval(gt, gt.loadRes(str(results_file)), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator.stats.tolist()


@pytest.mark.parametrize("backend", ["pycocotools", "hotcoco", "vernier"])
def test_every_backend_gives_pycocotools_numbers(
    falconet_cli, results_file, pycocotools_stats, backend
):
    result = falconet_cli(
        "eval", str(COCO128_JSON), str(results_file), "--backend", backend, "--json"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["backend"] == backend
    assert [report[k] for k in STAT_KEYS] == pycocotools_stats
    assert len(report["per_class"]) == 80


def test_default_backend_is_the_fastest_installed(falconet_cli, results_file):
    result = falconet_cli("eval", str(COCO128_JSON), str(results_file), "--json")
    assert json.loads(result.stdout)["backend"] == "hotcoco"
