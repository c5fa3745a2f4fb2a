"""``data=`` a folder as users bring one: the Roboflow COCO export (RF-DETR's format) or a
folder holding its data yaml, read with no yaml to write."""

from __future__ import annotations

import json

import numpy as np
import pytest

from falconet.data import DataError, load_dataset
from falconet.data.shapes import write_shapes
from falconet_testing.broken_data import save


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FALCONET_CACHE_DIR", str(tmp_path / "cache"))


def roboflow_export(root, splits=("train", "valid")):
    """Each split a folder of images with its ``_annotations.coco.json``, as Roboflow writes."""
    for n, split in enumerate(splits):
        folder = root / split
        for i in range(2):
            save(folder / f"{split}-{i}.jpg", size=(100, 50))
        coco = {
            "images": [
                {"id": i, "file_name": f"{split}-{i}.jpg", "width": 100, "height": 50}
                for i in range(2)
            ],
            "categories": [{"id": 1, "name": "dog"}, {"id": 2, "name": "cat"}],
            "annotations": [
                {"id": 1, "image_id": 0, "category_id": 2, "bbox": [10, 10, 20, 20 + n]},
                {"id": 2, "image_id": 1, "category_id": 1, "bbox": [0, 0, 50, 25]},
            ],
        }
        (folder / "_annotations.coco.json").write_text(json.dumps(coco))
    return root


def test_a_roboflow_coco_export_is_read_as_it_is(tmp_path):
    root = roboflow_export(tmp_path / "export", ("train", "valid", "test"))
    before = sorted(p.name for p in root.iterdir())
    dataset = load_dataset(root)
    assert dataset.names == ["dog", "cat"] and dataset.category_ids == [1, 2]
    assert sorted(dataset.splits) == ["train", "val"]
    val = {s.image.name: s for s in dataset.splits["val"].samples}
    np.testing.assert_allclose(val["valid-0.jpg"].boxes, [[0.1, 0.2, 0.3, 0.62]])
    assert val["valid-0.jpg"].labels.tolist() == [1]  # cat: id 2 -> contiguous 1
    assert sorted(p.name for p in root.iterdir()) == before  # nothing written into it
    assert len(load_dataset(root, splits=("test",)).splits["test"].samples) == 2


def test_a_folder_holding_its_data_yaml_is_that_yaml(tmp_path):
    data = write_shapes(tmp_path / "shapes", {"train": 3, "val": 2}, size=64)
    by_folder = load_dataset(data.parent)  # shapes.yaml, the folder's only yaml
    assert by_folder.source == str(data.resolve())
    assert len(by_folder.splits["train"].samples) == 3


def test_a_folder_with_neither_says_what_it_needs(tmp_path):
    (tmp_path / "a.yaml").write_text("train: x\n")
    (tmp_path / "b.yaml").write_text("train: y\n")
    with pytest.raises(DataError, match=r"a data\.yaml \(yaml files found: a\.yaml, b\.yaml\)"):
        load_dataset(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="Roboflow COCO layout"):
        load_dataset(tmp_path / "empty")


def test_an_ultralytics_yaml_whose_data_is_not_there_says_download_is_not_run(tmp_path):
    (tmp_path / "coco8.yaml").write_text(
        "path: ../datasets/coco8\ntrain: images/train\nval: images/val\nnames: {0: person}\n"
        "download: https://example.invalid/coco8.zip\n"
    )
    with pytest.raises(DataError, match=r"download: is not run .* point path: at it"):
        load_dataset(tmp_path / "coco8.yaml")
