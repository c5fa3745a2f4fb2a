"""``falconet train|val|predict`` end to end, in subprocesses, on the CPU."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from falconet.training.checkpoint import load_checkpoint

COCO128_YAML = Path(__file__).parents[2] / "shared/data/coco128/coco128.yaml"


def _pairs(keys: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in keys.items()]


def _rows(run: Path) -> list[dict[str, str]]:
    with (run / "results.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_train_two_epochs_on_shapes_then_val_and_predict(falconet_cli, tiny_run, tmp_path):
    keys = {**tiny_run, "epochs": "2", "plots": "true", "val_interval": "2"}
    done = falconet_cli("train", *_pairs(keys), env={"FALCONET_CACHE_DIR": str(tmp_path / "c")})
    assert done.returncode == 0, done.stderr
    run = tmp_path / "runs" / "exp"
    assert f"run folder: {run.resolve()}" in done.stdout
    assert "mAP50-95" in done.stdout
    rows = _rows(run)
    assert [r["epoch"] for r in rows] == ["1", "2"]
    assert rows[0]["metrics/mAP50"] == ""  # validated every 2 epochs: same columns, empty
    last = rows[-1]
    for column in ("train/box", "train/cls", "train/dfl"):
        assert 0 < float(last[column]) < math.inf, column  # every image has boxes to fit
    # known answer: warm-up spans at least 100 optimizer steps; 24 images in batches of 8 at
    # the set's nbs 16 (accumulate 2) step twice an epoch (the third batch's at the epoch's
    # end), so epoch 2 ends on step 3: lr0 * decay(epoch 1) * 3/100, decay(1) = 1/2 * 0.99 + 0.01
    assert float(last["lr"]) == pytest.approx(0.002 * 0.505 * 0.03, rel=1e-3)
    assert float(last["img/s"]) > 0
    for name in ("args.yaml", "results.png", "pr_curve.png", "weights/last.pt", "weights/best.pt"):
        assert (run / name).is_file(), name
    assert "epochs: 2" in (run / "args.yaml").read_text()
    best = load_checkpoint(run / "weights" / "best.pt")
    assert "optimizer" not in best and best["spec"]["model"] == "yolo-n"
    assert load_checkpoint(run / "weights" / "last.pt")["epoch"] == 2

    # a second run gets a fresh folder
    again = falconet_cli("train", *_pairs({**keys, "epochs": "1", "plots": "false"}))
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "runs" / "exp2" / "weights" / "last.pt").is_file()

    best_pt = str(run / "weights" / "best.pt")
    val = falconet_cli("val", f"model={best_pt}", "workers=0", "--json")
    assert val.returncode == 0, val.stderr
    metrics = json.loads(val.stdout)
    assert set(metrics["per_class"]) == {"circle", "square", "triangle", "cross", "ring"}
    assert metrics["AP"] == pytest.approx(float(last["metrics/mAP50-95"]), abs=1e-4)
    assert metrics["AP50"] == pytest.approx(float(last["metrics/mAP50"]), abs=1e-4)

    images = tiny_run["data"].replace("shapes.yaml", "images/val")
    pred = falconet_cli(
        "predict",
        f"model={best_pt}",
        f"source={images}",
        "conf=0.01",
        f"project={tmp_path / 'pred'}",
    )
    assert pred.returncode == 0, pred.stderr
    bad = falconet_cli("predict", f"model={best_pt}", f"source={images}", "conf=high")
    assert bad.returncode == 2 and "conf='high': expected float" in bad.stderr
    records = json.loads((tmp_path / "pred" / "exp" / "predictions.json").read_text())
    assert len(records) == 8
    assert all((tmp_path / "pred" / "exp" / Path(r["path"]).name).is_file() for r in records)
    for record in records:
        for det in record["detections"]:
            x1, y1, x2, y2 = det["box_xyxy"]
            assert 0 <= x1 <= x2 <= 64 and 0 <= y1 <= y2 <= 64


@pytest.mark.skipif(not COCO128_YAML.exists(), reason=f"needs COCO128 at {COCO128_YAML}")
def test_train_two_epochs_on_coco128_at_small_size(falconet_cli, tmp_path):
    done = falconet_cli(
        "train",
        f"data={COCO128_YAML}",
        "epochs=2",
        "imgsz=96",
        "batch=16",
        "workers=1",
        "fraction=0.25",
        "plots=false",
        f"project={tmp_path / 'runs'}",
        env={"FALCONET_CACHE_DIR": str(tmp_path / "cache")},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    rows = _rows(tmp_path / "runs" / "exp")
    assert len(rows) == 2
    state = load_checkpoint(tmp_path / "runs" / "exp" / "weights" / "last.pt")
    # the checkpoint records the scores of the epoch the run's results.csv shows as its best
    best = state["metrics"]
    assert best["best"] == pytest.approx(max(float(r["fitness"]) for r in rows), abs=1e-4)
    best_row = rows[best["best_epoch"] - 1]
    assert best["best_eval"]["stats"]["AP"] == pytest.approx(
        float(best_row["metrics/mAP50-95"]), abs=1e-4
    )
    assert len(state["spec"]["names"]) == 80


@pytest.mark.parametrize(
    ("pair", "expected"),
    [
        ("epoch=3", "unknown key 'epoch'; did you mean epochs=?"),
        ("amp_dtype=fp8", "amp_dtype=fp8 needs a CUDA GPU"),  # on the CPU
        ("epochs", "'epochs' is not key=value"),
        ("batch=1.5", "neither a number of images (1 or more) nor autobatch"),
        ("batch=-1", "give the batch as a number of images, e.g. batch=16"),  # on the CPU
        ("cache=gpu", "cache=gpu decodes or keeps the images on the GPU and this run is on cpu"),
    ],
)
def test_bad_keys_are_clear_errors_on_the_command_line(falconet_cli, tiny_run, pair, expected):
    done = falconet_cli("train", *_pairs(tiny_run), pair)
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr
    assert "Traceback" not in done.stderr


def test_help_lists_every_key_with_default(falconet_cli, installed_falconet_plugins):
    """The core's keys first, then each plugin's under its distribution's name."""
    from falconet.training.config import CORE, config_model, describe_keys

    done = falconet_cli("train", "--help")
    assert done.returncode == 0
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    rows = describe_keys(config_model(installed_falconet_plugins))
    owners = {owner for *_, owner in rows}
    assert {CORE, "falconet-graphs-cuda", "falconet-profiler"} <= owners
    for key, default, _meaning, owner in rows:
        (at,) = [i for i, line in enumerate(lines) if line.split()[:2] == [key, default]]
        headings = [line.strip() for line in lines[:at] if line.strip().startswith("Keys ")]
        expected = "Keys (KEY=VALUE; default, meaning):" if owner == CORE else f"Keys of {owner}:"
        assert headings[-1] == expected, key
    assert "compile_mode" in [key for key, *_, owner in rows if owner == CORE]


def test_early_stopping_fires_on_the_metric_asked_for(falconet_cli, tiny_run, tmp_path):
    # no epoch can gain 0.5 mAR over the one before: patience 1 stops after the second epoch
    keys = ("epochs=6", "patience=1", "min_delta=0.5", "metric=mar100")
    done = falconet_cli("train", *_pairs(tiny_run), *keys)
    assert done.returncode == 0, done.stderr
    assert "early stop: mar100 has not improved" in done.stderr
    rows = _rows(tmp_path / "runs" / "exp")
    assert len(rows) == 2
    # the followed number is the validator's mAR100, logged with the patience counter
    assert [r["fitness"] for r in rows] == [r["metrics/mAR100"] for r in rows]
    counters = [line for line in done.stderr.splitlines() if "validations without a gain" in line]
    assert len(counters) == 2
    assert "0 of patience 1" in counters[0] and "1 of patience 1" in counters[1]
    assert f"best {float(rows[0]['fitness']):.4f} at epoch 1" in counters[1]


@pytest.mark.parametrize("weights", ["ema", "raw"])
def test_best_pt_keeps_the_weights_validation_scored(falconet_cli, tiny_run, tmp_path, weights):
    """One epoch: its validation is the best, so best.pt holds exactly the weights it scored,
    the EMA's or the raw model's (both in last.pt, which differ after an epoch)."""
    done = falconet_cli("train", *_pairs(tiny_run), "epochs=1", f"val_weights={weights}")
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "runs" / "exp" / "weights"
    best, last = load_checkpoint(folder / "best.pt"), load_checkpoint(folder / "last.pt")
    raw, ema = last["model"], last["ema"]["state"]
    assert any(not torch.equal(raw[k], ema[k]) for k in raw)
    scored = ema if weights == "ema" else raw
    assert all(torch.equal(best["weights"][k], scored[k]) for k in scored)


def test_refuses_a_checkpoint_with_an_arbitrary_object(falconet_cli, tmp_path):
    from argparse import Namespace

    path = tmp_path / "evil.pt"
    torch.save({"format": 1, "payload": Namespace(a=1)}, path)
    done = falconet_cli("val", f"model={path}")
    assert done.returncode == 2
    assert "argparse.Namespace" in done.stderr and "weights_only=True" in done.stderr


def test_training_on_broken_data_completes_and_reports_what_it_skipped(falconet_cli, tmp_path):
    from falconet_testing.broken_data import write_broken_yolo

    data = write_broken_yolo(tmp_path / "broken", val=True)
    done = falconet_cli(
        "train",
        f"data={data}",
        "epochs=1",
        "imgsz=64",
        "batch=4",
        "workers=0",
        "plots=false",
        f"project={tmp_path / 'runs'}",
        env={"FALCONET_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    summary = [line for line in done.stderr.splitlines() if line.startswith("data train:")]
    assert len(summary) == 1  # one summary line per split, not one line per file
    for part in (
        "14 of 17 images usable",
        "zero-byte-image 1 (skipped)",
        "corrupt-image 1 (skipped)",
        "truncated-image 1 (skipped)",
        "label-class 1 (dropped)",
        "falconet data check",
    ):
        assert part in summary[0], part
    assert len(_rows(tmp_path / "runs" / "exp")) == 1
