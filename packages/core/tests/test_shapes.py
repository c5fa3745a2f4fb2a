"""The built-in ``shapes`` set: made locally, deterministic, boxes on the drawn pixels."""

from __future__ import annotations

import numpy as np
from PIL import Image

from falconet.data import load_dataset
from falconet.data.shapes import CLASSES, make_image, textured_background, write_shapes


def test_same_seed_same_set(tmp_path):
    a = write_shapes(tmp_path / "a", {"train": 6, "val": 2})
    b = write_shapes(tmp_path / "b", {"train": 6, "val": 2})
    for split, count in (("train", 6), ("val", 2)):
        for i in range(count):
            stem = f"{split}_{i:06d}"
            for kind, suffix in (("labels", "txt"), ("images", "jpg")):
                one = (a.parent / kind / split / f"{stem}.{suffix}").read_bytes()
                assert one == (b.parent / kind / split / f"{stem}.{suffix}").read_bytes()
    train = (a.parent / "labels" / "train" / "train_000000.txt").read_text()
    assert train != (a.parent / "labels" / "val" / "val_000000.txt").read_text()


def test_boxes_enclose_exactly_the_drawn_pixels():
    """Every changed pixel lies in some box, and every box holds its shape."""
    for seed in range(20):
        pixels, objects = make_image(seed)
        background = textured_background(
            np.random.default_rng(seed), 256
        )  # the first draw of the seed
        changed = (pixels != background).any(axis=2)
        inside_any = np.zeros_like(changed)
        assert objects, "every image holds at least one object"
        for cls, box in objects:
            assert 0 <= cls < len(CLASSES)
            x0, y0 = np.floor(box[:2]).astype(int)
            x1, y1 = np.ceil(box[2:]).astype(int) + 1
            inside_any[y0:y1, x0:x1] = True
            assert changed[y0:y1, x0:x1].mean() > 0.15, (seed, CLASSES[cls])
        assert not (changed & ~inside_any).any(), seed


def test_data_shapes_is_built_once_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FALCONET_CACHE_DIR", str(tmp_path))
    dataset = load_dataset("shapes")
    assert dataset.names == list(CLASSES)
    assert [len(s.samples) for s in dataset.splits.values()] == [320, 80]
    assert not dataset.problems
    built = tmp_path / "datasets" / "shapes-v2" / "shapes.yaml"
    assert built.exists()
    mtime = built.stat().st_mtime_ns
    load_dataset("shapes")
    assert built.stat().st_mtime_ns == mtime  # not rebuilt
    first = Image.open(tmp_path / "datasets/shapes-v2/images/train/train_000000.jpg")
    assert first.size == (256, 256) and first.mode == "RGB"
    assert np.asarray(first).std() > 10  # textured, not flat
