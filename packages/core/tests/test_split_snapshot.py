"""A YOLO split taken whole from its snapshot while no file changed, and checked again where
one did (falconet.data.split_snapshot)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from falconet.data import check
from falconet.data.resolve import load_dataset
from falconet.data.shapes import write_shapes


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FALCONET_CACHE_DIR", str(tmp_path / "cache"))


def test_an_unchanged_split_comes_from_its_snapshot_equal_to_the_checked_one(tmp_path, monkeypatch):
    data = write_shapes(tmp_path / "shapes", {"train": 12, "val": 3}, size=64)
    labels = sorted((tmp_path / "shapes" / "labels" / "train").iterdir())
    labels[3].unlink()  # a background image: a problem the snapshot must keep
    checked = load_dataset(data)
    assert list((tmp_path / "cache" / "splits").glob("*.npz"))

    def no_per_file_cache(*args, **kwargs):
        raise AssertionError("the per-file cache was read for an unchanged split")

    with monkeypatch.context() as patch:
        patch.setattr(check, "_Cache", no_per_file_cache)
        again = load_dataset(data)
    for name in ("train", "val"):
        a, b = checked.splits[name], again.splits[name]
        assert (a.images_total, a.problems) == (b.images_total, b.problems)
        assert len(a.samples) == len(b.samples)
        for x, y in zip(a.samples, b.samples, strict=True):
            assert (x.image, x.image_id, x.width, x.height) == (
                y.image,
                y.image_id,
                y.width,
                y.height,
            )
            assert x.exif_oriented == y.exif_oriented
            for field in ("boxes", "labels", "crowd"):
                assert np.array_equal(getattr(x, field), getattr(y, field))
                assert getattr(x, field).dtype == getattr(y, field).dtype
    assert any(p.code == "no-label-file" for p in again.splits["train"].problems)
    with pytest.raises(ValueError, match="read-only"):  # views of one array: never written
        again.splits["train"].samples[0].boxes[0, 0] = 0.0


def test_a_changed_label_file_is_read_again(tmp_path):
    data = write_shapes(tmp_path / "shapes", {"train": 6}, size=64)
    load_dataset(data, splits=("train",))
    label = sorted((tmp_path / "shapes" / "labels" / "train").iterdir())[2]
    label.write_text("0 0.5 0.5 0.2 0.2\n")
    stat = label.stat()  # a new time as well, should the file system's clock be coarse
    os.utime(label, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    again = load_dataset(data, splits=("train",))
    sample = next(s for s in again.splits["train"].samples if s.image.stem == label.stem)
    assert sample.labels.tolist() == [0]
    assert np.allclose(sample.boxes, [[0.4, 0.4, 0.6, 0.6]])


def test_a_yaml_combining_folders_checked_before_decodes_none_of_their_images(
    tmp_path, monkeypatch
):
    """The per-file results are kept per image folder, not per yaml: a second yaml over the
    same folder (or several) checks nothing again."""
    data = write_shapes(tmp_path / "shapes", {"train": 5}, size=64)
    load_dataset(data, splits=("train",))
    other = tmp_path / "shapes" / "again.yaml"
    other.write_text(data.read_text())
    checked = []
    monkeypatch.setattr(check, "inspect_image", lambda path: checked.append(path))
    again = load_dataset(other, splits=("train",))
    assert checked == [] and len(again.splits["train"].samples) == 5


def test_a_snapshot_s_samples_load_without_a_warning(tmp_path):
    """The validation loader passes a sample's boxes and labels through untouched: from a
    snapshot those are read-only views, which the loader copies instead of handing torch
    memory it cannot write (torch warned once a run)."""
    import warnings

    from falconet.data.loader import DetectionDataset

    data = write_shapes(tmp_path / "shapes", {"train": 4, "val": 2}, size=64)
    load_dataset(data)
    split = load_dataset(data).splits["val"]  # the snapshot's
    assert not split.samples[0].labels.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        item = DetectionDataset(split.samples, 64)[0]
    assert item["labels"].tolist() == split.samples[0].labels.tolist()
