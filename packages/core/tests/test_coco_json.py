"""Reading COCO files, and ``falconet eval`` on them, with bad files refused clearly."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from falconet.cli import build_cli
from falconet.evaluation import EvalInputError
from falconet.evaluation.coco_json import load_ground_truth, load_results, save_results
from falconet_testing.eval_cases import (
    COCO128_BBOX_JSON,
    coco128_ground_truth,
    generated_detections,
)


def test_ground_truth_keeps_ids_crowd_and_areas():
    gt = load_ground_truth(COCO128_BBOX_JSON)
    assert (len(gt.image_ids), len(gt.ann_image_ids), len(gt.category_ids)) == (128, 939, 80)
    assert int(gt.ann_iscrowd.sum()) == 10
    assert gt.category_ids[:3].tolist() == [1, 2, 3] and gt.category_names[0] == "person"
    assert gt.category_ids[-1] == 90


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON: Expecting property name"),
        ("[]", "must be a COCO instances object"),
        (
            '{"images": [{"id": 1}], "annotations": [], "categories": []}',
            r"images\[0\] lacks height, width",
        ),
        (
            '{"images": [{"id": 1, "height": 2, "width": 2}], '
            '"categories": [{"id": 1, "name": "a"}],'
            ' "annotations": [{"image_id": 2, "category_id": 1, "bbox": [0, 0, 1, 1]}]}',
            "annotations refer to 1 image ids not in the ground truth: 2",
        ),
        (
            '{"images": [], "categories": [], "annotations": [{"image_id": 1, "category_id": 1, '
            '"bbox": [0, 0, 1]}]}',
            r"bbox must be \[x, y, w, h\]",
        ),
    ],
)
def test_bad_ground_truth_is_refused_with_the_reason(tmp_path, content, message):
    path = tmp_path / "gt.json"
    path.write_text(content)
    with pytest.raises(EvalInputError, match=message):
        load_ground_truth(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"annotations": []}', "must be a JSON list of detections"),
        ('[{"image_id": 1, "bbox": [0, 0, 1, 1], "score": 0.5}]', r"\[0\] lacks category_id"),
        ('[{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": NaN}]', "finite"),
    ],
)
def test_bad_results_are_refused_with_the_reason(tmp_path, content, message):
    path = tmp_path / "results.json"
    path.write_text(content)
    with pytest.raises(EvalInputError, match=message):
        load_results(path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(EvalInputError, match=r"results file .*nope\.json: cannot read it"):
        load_results(tmp_path / "nope.json")


def run_eval(plugins, *args):
    return CliRunner().invoke(build_cli(plugins), ["eval", *map(str, args)], obj=plugins)


def test_eval_command_prints_the_stats_and_json(tmp_path, falconet_plugins):
    gt = coco128_ground_truth()
    results = save_results(generated_detections(gt, 0), tmp_path / "results.json")
    table = run_eval(falconet_plugins, COCO128_BBOX_JSON, results, "--per-class")
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0].startswith(
        "COCO bbox evaluation: 128 images, 939 ground-truth boxes (10 crowd)"
    )
    assert lines[1].split() == ["AP", "AP50", "AP75", "APs", "APm", "APl"]
    assert any(line.startswith("person ") for line in lines)
    report = json.loads(run_eval(falconet_plugins, COCO128_BBOX_JSON, results, "--json").output)
    assert report["backend"] == "pycocotools"
    assert 0.0 < report["AP"] < 1.0
    assert set(report["per_class"]["person"]) == {"AP", "AP50"}
    assert f"{report['AP']:6.3f}" in lines[2]


@pytest.mark.parametrize(
    ("results", "message"),
    [
        ("not json at all", "is not valid JSON"),
        (
            '[{"image_id": 7777777, "category_id": 1, "bbox": [0, 0, 1, 1], "score": 1}]',
            "1 image ids not in the ground truth: 7777777",
        ),
        ('{"a": 1}', "must be a JSON list"),
    ],
)
def test_eval_command_exits_2_on_bad_files(tmp_path, falconet_plugins, results, message):
    path = tmp_path / "results.json"
    path.write_text(results)
    result = run_eval(falconet_plugins, COCO128_BBOX_JSON, path)
    assert result.exit_code == 2
    assert message in result.output


def test_eval_command_unknown_backend_names_the_install(tmp_path, falconet_plugins):
    path = save_results(generated_detections(coco128_ground_truth(), 1), tmp_path / "r.json")
    result = run_eval(falconet_plugins, COCO128_BBOX_JSON, path, "--backend", "hotcoco")
    assert result.exit_code == 2
    assert "eval_backend=hotcoco needs: pip install falconet-eval-hotcoco" in result.output


def test_results_round_trip(tmp_path):
    dets = generated_detections(coco128_ground_truth(), 2)
    again = load_results(save_results(dets, tmp_path / "r.json"))
    for field in ("image_ids", "category_ids", "boxes", "scores"):
        assert (getattr(again, field) == getattr(dets, field)).all()
