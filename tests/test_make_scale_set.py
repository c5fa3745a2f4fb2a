"""tools/make_scale_set.py on a small source of solid rectangles at known boxes: the written
labels follow the crops, flips and rescales (the rectangle's pixels lie inside its box and fill
it), the set loads as falconet reads it, and the same seed writes the same set."""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from make_scale_set import LONG_SIDE, main

from falconet.data.resolve import load_dataset

COLOUR = (255, 0, 0)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FALCONET_CACHE_DIR", str(tmp_path / "cache"))


def source(root: Path) -> Path:
    """Three grey images, each with one red rectangle at a known box."""
    for split in ("images", "labels"):
        (root / split / "train").mkdir(parents=True)
    for i, (w, h, box) in enumerate(
        [
            (400, 300, (80, 60, 200, 180)),
            (300, 400, (20, 250, 150, 390)),
            (500, 500, (300, 100, 480, 260)),
        ]
    ):
        image = np.full((h, w, 3), 90, np.uint8)
        x0, y0, x1, y1 = box
        image[y0:y1, x0:x1] = COLOUR[::-1]  # BGR
        cv2.imwrite(
            str(root / "images" / "train" / f"{i}.jpg"), image, [cv2.IMWRITE_JPEG_QUALITY, 98]
        )
        cx, cy, bw, bh = (x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h
        (root / "labels" / "train" / f"{i}.txt").write_text(f"0 {cx} {cy} {bw} {bh}\n")
    (root / "data.yaml").write_text(
        "path: .\ntrain: images/train\nval: images/train\nnames: [red]\n"
    )
    return root / "data.yaml"


def test_the_boxes_follow_the_crops_flips_and_rescales(tmp_path):
    data = source(tmp_path / "src")
    out = tmp_path / "out"
    summary = main(
        ["--source", str(data), "--images", "24", "--val", "4", "--out", str(out), "--workers", "2"]
    )
    assert summary["images"] == 24
    dataset = load_dataset(out / "data.yaml")
    assert len(dataset.splits["train"].samples) == 24 and len(dataset.splits["val"].samples) == 4
    boxes, lefts = 0, []
    for sample in dataset.splits["train"].samples:
        image = cv2.imread(str(sample.image))[:, :, ::-1].astype(int)
        h, w = image.shape[:2]
        assert 480 <= max(h, w) <= LONG_SIDE
        red = (image[:, :, 0] > 180) & (image[:, :, 1] < 80) & (image[:, :, 2] < 80)
        ys, xs = np.nonzero(red)
        for x0, y0, x1, y1 in sample.boxes * [w, h, w, h]:
            boxes += 1
            assert xs.min() >= x0 - 2 and xs.max() <= x1 + 2  # the colour inside the box
            assert ys.min() >= y0 - 2 and ys.max() <= y1 + 2
            inner = red[int(y0) + 2 : int(y1) - 2, int(x0) + 2 : int(x1) - 2]
            assert inner.mean() > 0.95  # and the box filled by it
            lefts.append(x0 / w)
        if not len(sample.boxes):  # cropped to under 20% of the rectangle: a sliver is left
            assert red.mean() < 0.1
    assert boxes >= 12
    assert min(lefts) < 0.3 and max(lefts) > 0.4  # source 0 mirrored and not (its box at 0.2)


def test_the_same_seed_writes_the_same_labels_and_bad_arguments_are_refused(tmp_path, capsys):
    data = source(tmp_path / "src")
    runs = []
    for name in ("a", "b"):
        main(
            [
                "--source",
                str(data),
                "--images",
                "6",
                "--val",
                "0",
                "--out",
                str(tmp_path / name),
                "--workers",
                "1",
            ]
        )
        runs.append(
            [p.read_text() for p in sorted((tmp_path / name / "labels" / "train").iterdir())]
        )
    assert runs[0] == runs[1] and len(runs[0]) == 6
    main(["--source", str(data), "--images", "3", "--val", "0", "--out", str(tmp_path / "b"),
          "--workers", "1", "--force"])  # fmt: skip
    assert len(list((tmp_path / "b" / "labels" / "train").iterdir())) == 3  # the old 6 gone
    with pytest.raises(SystemExit):
        main(["--source", str(data), "--images", "3", "--out", str(tmp_path / "a")])
    assert "is not empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--source", str(data), "--images", "0", "--out", str(tmp_path / "c")])
    assert "need at least one image" in capsys.readouterr().err
