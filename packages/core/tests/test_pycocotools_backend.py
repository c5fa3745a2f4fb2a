"""The reference backend: pycocotools driven directly gives the same numbers; what pycocotools
crashes on is handled."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
from pycocotools.cocoeval import COCOeval

from falconet.evaluation import Detections, EvalInputError
from falconet.evaluation.evaluate import evaluate
from falconet.evaluation.pycocotools_backend import PycocotoolsBackend, coco_from_ground_truth
from falconet_testing.contracts import EvalBackendContract
from falconet_testing.eval_cases import (
    COCO128_BBOX_JSON,
    coco128_ground_truth,
    generated_detections,
)


class TestPycocotoolsContract(EvalBackendContract):
    backend = PycocotoolsBackend()


def test_matches_pycocotools_used_the_usual_way(tmp_path):
    """Arrays in, the same 12 stats as COCO(file) + loadRes(list of dicts) + COCOeval."""
    from pycocotools.coco import COCO

    gt = coco128_ground_truth()
    dets = generated_detections(gt, seed=11)
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(COCO128_BBOX_JSON))
        results = coco.loadRes(
            [
                {"image_id": int(i), "category_id": int(c), "bbox": list(b), "score": float(s)}
                for i, c, b, s in zip(
                    dets.image_ids, dets.category_ids, dets.boxes, dets.scores, strict=True
                )
            ]
        )
        usual = COCOeval(coco, results, "bbox")
        usual.evaluate()
        usual.accumulate()
        usual.summarize()
    ours = PycocotoolsBackend().evaluate(gt, dets)
    assert list(ours.stats.values()) == usual.stats.tolist()
    assert 0.1 < ours.stats["AP"] < 0.9  # a real, non-degenerate score


def test_no_detections_gives_zeros_where_pycocotools_crashes():
    gt = coco128_ground_truth()
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(IndexError):
        coco_from_ground_truth(gt).loadRes([])  # what we work around
    result = PycocotoolsBackend().evaluate(gt, Detections.empty())
    assert set(result.stats.values()) == {0.0}
    assert result.per_class_ap["person"] == 0.0
    assert result.per_class_ap["hair drier"] == -1.0  # no ground truth for it in COCO128


def test_per_class_ap_is_keyed_by_name_and_averages_to_ap():
    gt = coco128_ground_truth()
    result = PycocotoolsBackend().evaluate(gt, generated_detections(gt, seed=3))
    assert list(result.per_class_ap) == list(gt.names_by_sorted_id())
    defined = [v for v in result.per_class_ap.values() if v > -1]
    assert len(defined) == 71  # the categories COCO128 has boxes for
    assert np.mean(defined) == pytest.approx(result.stats["AP"], abs=1e-12)


def test_unknown_image_ids_are_an_error_naming_them(falconet_plugins):
    gt = coco128_ground_truth()
    dets = Detections(
        image_ids=[9, 123456, 654321],
        category_ids=[1, 1, 1],
        boxes=np.ones((3, 4)),
        scores=[0.1, 0.2, 0.3],
    )
    with pytest.raises(EvalInputError, match="2 image ids not in the ground truth: 123456, 654321"):
        evaluate(gt, dets, backend="pycocotools", plugins=falconet_plugins)


def test_unknown_category_ids_are_an_error(falconet_plugins):
    gt = coco128_ground_truth()
    dets = Detections(image_ids=[9], category_ids=[0], boxes=np.ones((1, 4)), scores=[0.5])
    with pytest.raises(
        EvalInputError, match="category ids not in the ground truth: 0; map contiguous labels"
    ):
        evaluate(gt, dets, backend="pycocotools", plugins=falconet_plugins)


class FakeEval:
    """An eval backend that answers as the reference does, or whose library is missing."""

    summary = "test evaluator"

    def __init__(self, name: str, priority: int, available: bool = True) -> None:
        self.name, self.priority, self.available = name, priority, available

    def version(self):
        from falconet.evaluation import EvalBackendUnavailable

        if not self.available:
            raise EvalBackendUnavailable(f"eval_backend={self.name} needs a missing library")
        return "1"

    def evaluate(self, ground_truth, detections, *, threads=None):
        return PycocotoolsBackend().evaluate(ground_truth, detections, threads=threads)


def test_auto_takes_the_importable_backend_of_highest_priority(falconet_plugins):
    from types import SimpleNamespace

    from falconet.contract import EvalBackend
    from falconet.evaluation.evaluate import default_backend_name

    assert PycocotoolsBackend.priority == 0
    assert default_backend_name(falconet_plugins) == "pycocotools"  # the built-ins alone
    fakes = [
        FakeEval("fastest-missing", 90, available=False),  # skipped: its library is missing
        FakeEval("fast", 30),
        FakeEval("a-fast", 30),  # a tie goes by name
        FakeEval("slow", -5),  # below the reference
    ]
    assert all(isinstance(f, EvalBackend) for f in fakes)
    falconet_plugins.add_plugin(
        SimpleNamespace(register_eval_backends=lambda register: [register(f) for f in fakes]),
        "fakes",
        "fake-evals",
    )
    assert default_backend_name(falconet_plugins) == "a-fast"
    ground_truth = coco128_ground_truth()
    detections = generated_detections(ground_truth, seed=0)
    result = evaluate(ground_truth, detections, plugins=falconet_plugins)
    reference = PycocotoolsBackend().evaluate(ground_truth, detections)
    assert result.stats == reference.stats
