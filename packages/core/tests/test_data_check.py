"""``falconet data check`` and the checks training runs: one broken file per problem."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from falconet.cli import build_cli
from falconet.data import DataError, load_dataset
from falconet.plugins import Plugins
from falconet_testing.broken_data import EXPECTED, save, write_broken_yolo


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FALCONET_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def broken_yolo(tmp_path) -> Path:
    return write_broken_yolo(tmp_path / "broken")


def test_every_problem_is_named_with_its_file_and_line(broken_yolo):
    split = load_dataset(broken_yolo).splits["train"]
    found = {Path(p.path).name: (p.code, p.action, p.line) for p in split.problems}
    assert found == EXPECTED
    assert split.images_total == 17 and len(split.samples) == 14
    by_name = {s.image.name: s for s in split.samples}
    assert len(by_name["good.jpg"].boxes) == 2
    assert len(by_name["duplicate.jpg"].boxes) == 1
    np.testing.assert_allclose(by_name["clipped.jpg"].boxes, [[0.85, 0.4, 1.0, 0.6]], atol=1e-6)
    assert (by_name["rotated.jpg"].width, by_name["rotated.jpg"].height) == (48, 64)
    assert len(by_name["background.jpg"].boxes) == 0
    assert "label-class 1 (dropped)" in split.summary()


def test_check_command_reports_and_sets_the_exit_status(broken_yolo):
    plugins = Plugins(env={}).load_builtins()
    cli = build_cli(plugins)

    def run(*args):
        return CliRunner().invoke(cli, ["data", "check", str(broken_yolo), *args], obj=plugins)

    text = run()
    assert text.exit_code == 0
    assert "labels/train/class.txt:1: class 7 is not in 0..1 (names has 2)" in text.output
    assert "train: 14 of 17 images usable" in text.output
    assert run("--strict").exit_code == 1
    as_train_takes_it = CliRunner().invoke(
        cli, ["data", "check", f"data={broken_yolo}"], obj=plugins
    )
    assert as_train_takes_it.exit_code == 0 and as_train_takes_it.output == text.output
    report = json.loads(run("--json").output)
    assert report["usable"] is True
    assert report["splits"]["train"]["usable"] == 14
    assert {p["code"] for p in report["splits"]["train"]["problems"]} == {
        code for code, _, _ in EXPECTED.values()
    }


def test_nothing_usable_exits_2_with_the_reason(tmp_path):
    root = tmp_path / "dead"
    (root / "images" / "train").mkdir(parents=True)
    (root / "images" / "train" / "a.jpg").write_bytes(b"")
    (root / "data.yaml").write_text("train: images/train\nnames: [x]\n")
    plugins = Plugins(env={}).load_builtins()
    result = CliRunner().invoke(
        build_cli(plugins), ["data", "check", str(root / "data.yaml")], obj=plugins
    )
    assert result.exit_code == 2
    assert "no usable image left in train" in result.output


def test_a_dataset_with_nothing_usable_is_refused_with_the_reason(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(b"")
    (tmp_path / "images" / "b.jpg").write_bytes(b"garbage")
    (tmp_path / "d.yaml").write_text("train: images\nnames: [x]\n")
    dataset = load_dataset(tmp_path / "d.yaml")
    with pytest.raises(DataError) as err:
        dataset.require_usable()
    message = str(err.value)
    assert "no usable image in train (2 found; " in message
    assert "zero-byte-image: 1" in message and "corrupt-image: 1" in message


def test_the_usable_part_of_a_broken_dataset_loads_end_to_end(broken_yolo):
    from falconet.data.loader import DetectionDataset, build_loader
    from falconet.data.transforms import AugmentConfig

    dataset = load_dataset(broken_yolo)
    dataset.require_usable()
    split = dataset.splits["train"]
    loader = build_loader(DetectionDataset(split.samples, 64, augment=AugmentConfig()), 4)
    seen = sum(len(batch["images"]) for batch in loader)
    assert seen == 14  # every usable image, the 16-bit, palette and rotated ones included
    assert split.summary().startswith("train: 14 of 17 images usable; ")


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        ("train: images\nnames: 3\n", "names must be a non-empty list"),
        ("train: images\nnames: [a]\nnc: 2\n", "nc is 2 but names lists 1"),
        ("names: [a]\n", "names no split"),
        ("train: nowhere\nnames: [a]\n", "neither a folder of images nor a .txt list"),
        ("train: [unclosed\n", "is not valid YAML"),
    ],
)
def test_bad_yaml_is_a_clear_error(tmp_path, yaml, message):
    (tmp_path / "images").mkdir()
    (tmp_path / "d.yaml").write_text(yaml)
    with pytest.raises(DataError, match=message):
        load_dataset(tmp_path / "d.yaml")


def test_second_run_reads_the_cache_not_the_images(broken_yolo):
    load_dataset(broken_yolo)
    good = broken_yolo.parent / "images" / "train" / "good.jpg"
    stat = good.stat()
    good.write_bytes(b"X" * stat.st_size)  # corrupt it, same size ...
    os.utime(good, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # ... and same mtime
    cached = load_dataset(broken_yolo).splits["train"]
    assert "good.jpg" in {s.image.name for s in cached.samples}  # the cached verdict was used
    os.utime(good, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: checked again
    fresh = load_dataset(broken_yolo).splits["train"]
    assert "good.jpg" not in {s.image.name for s in fresh.samples}


def test_coco_json_problems_and_crowd(tmp_path):
    images = tmp_path / "images"
    for name in ("a.jpg", "b.jpg"):
        save(images / name, size=(100, 50))
    coco = {
        "images": [
            {"id": 1, "file_name": "a.jpg", "width": 100, "height": 50},
            {"id": 2, "file_name": "b.jpg", "width": 100, "height": 50},
            {"id": 2, "file_name": "b-again.jpg", "width": 100, "height": 50},
            {"id": 3, "file_name": "missing.jpg", "width": 100, "height": 50},
        ],
        "categories": [{"id": 7, "name": "dog"}, {"id": 3, "name": "cat"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 7, "bbox": [10, 10, 20, 20], "iscrowd": 0},
            {"id": 2, "image_id": 1, "category_id": 3, "bbox": [50, 0, 50, 50], "iscrowd": 1},
            {"id": 2, "image_id": 2, "category_id": 3, "bbox": [0, 0, 5, 5], "iscrowd": 0},
            {"id": 3, "image_id": 9, "category_id": 3, "bbox": [0, 0, 5, 5], "iscrowd": 0},
            {"id": 4, "image_id": 2, "category_id": 99, "bbox": [0, 0, 5, 5], "iscrowd": 0},
        ],
    }
    (tmp_path / "instances.json").write_text(json.dumps(coco))
    (tmp_path / "d.yaml").write_text("train: images\ncoco_json: instances.json\n")
    dataset = load_dataset(tmp_path / "d.yaml")
    assert dataset.names == ["cat", "dog"] and dataset.category_ids == [3, 7]
    split = dataset.splits["train"]
    codes = sorted((p.code, p.action) for p in split.problems)
    assert codes == [
        ("coco-duplicate-id", "dropped"),
        ("coco-duplicate-id", "skipped"),
        ("coco-unknown-category", "dropped"),
        ("coco-unknown-image", "dropped"),
        ("missing-image", "skipped"),
    ]
    a = next(s for s in split.samples if s.image_id == 1)
    np.testing.assert_allclose(a.boxes, [[0.1, 0.2, 0.3, 0.6]])
    assert a.labels.tolist() == [1]  # dog: id 7 -> contiguous 1
    np.testing.assert_allclose(a.crowd, [[0.5, 0.0, 1.0, 1.0]])  # crowd kept apart


COCO128 = Path(__file__).parents[4] / "shared" / "data" / "coco128"


@pytest.mark.skipif(not COCO128.exists(), reason=f"needs the shared COCO128 data at {COCO128}")
def test_coco_json_and_yolo_labels_of_coco128_agree(tmp_path):
    coco = load_dataset(COCO128 / "coco128.yaml", splits=("train",)).splits["train"]
    (tmp_path / "y.yaml").write_text(
        f"path: {COCO128}\ntrain: images/train2017\nnames: "
        f"{load_dataset(COCO128 / 'coco128.yaml').names}\n"
    )
    yolo = load_dataset(tmp_path / "y.yaml").splits["train"]
    by_image = {s.image.name: s for s in yolo.samples}
    assert len(coco.samples) == len(yolo.samples) == 128
    for sample in coco.samples:
        other = by_image[sample.image.name]
        assert sorted(sample.labels.tolist()) == sorted(other.labels.tolist())
        for box, cls in zip(sample.boxes, sample.labels, strict=True):  # each has a twin
            same_class = other.boxes[other.labels == cls]
            assert np.abs(same_class - box).max(axis=1).min() < 2e-3, sample.image.name
