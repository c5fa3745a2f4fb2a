"""falconet-detr from the front door: ``Detector("detr-n").train`` on the tiny shapes set
with the family's recipe (AdamW at 4e-4, the backbone at the same rate, the hungarian matcher),
its checkpoint loaded back for prediction."""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import pytest
import yaml

from falconet import Detector


def test_detr_n_trains_with_its_recipe_and_its_checkpoint_predicts(tiny_run):
    summary = Detector("detr-n").train(**tiny_run, epochs=2)
    assert summary["epochs"] == 2 and math.isfinite(summary["best_fitness"])
    run_dir = Path(summary["run_dir"])
    args = yaml.safe_load((run_dir / "args.yaml").read_text())
    assert (args["optimizer"], args["assigner"], args["weight_decay"]) == (
        "adamw",
        "hungarian",
        1e-4,
    )
    assert args["backbone_lr_scale"] == 1.0  # the backbone starts from scratch (docs/detr.md)
    assert args["clip_grad"] == 0.1 and args["mosaic"] == 0.0
    detector = Detector(run_dir / "weights" / "best.pt")
    images = Path(tiny_run["data"]).parent / "images" / "val"
    results = detector.predict(images, conf=0.0001, device="cpu")
    assert len(results) == 8 and all(len(r["boxes"]) == len(r["scores"]) for r in results)


def test_a_checkpoint_trained_in_a_precision_not_available_here_evaluates(tiny_run, tmp_path):
    """An fp8-trained checkpoint (its precision needs a CUDA GPU and Transformer Engine) with a
    key of a plugin not installed here: ``val`` drops the key and evaluates in ``auto``."""
    import torch

    summary = Detector("detr-n").train(**tiny_run, epochs=1)
    checkpoint = torch.load(
        Path(summary["run_dir"]) / "weights" / "best.pt", map_location="cpu", weights_only=True
    )
    checkpoint["config"] = {**checkpoint["config"], "amp_dtype": "fp8", "absent_key": 1}
    moved = tmp_path / "fp8-trained.pt"
    torch.save(checkpoint, moved)
    result = Detector(moved).val(data=tiny_run["data"], device="cpu", imgsz=64)
    # known answer: the same weights on the same images score what the run's own
    # validation of them recorded, every stat and class
    recorded = checkpoint["metrics"]["best_eval"]
    assert dict(result.stats) == recorded["stats"]
    assert dict(result.per_class_ap) == recorded["per_class_ap"]


@pytest.mark.skipif(
    not any(map(shutil.which, ("c++", "g++", "clang++"))),
    reason="Inductor needs a C++ compiler on the CPU and none is on PATH",
)
def test_detr_n_trains_under_graph_compile(tiny_run, caplog):
    """``graph=compile`` takes detr-n's whole network (its capture region): deformable
    attention's ``grid_sample``, query selection's fixed ``topk`` and the anchors compile with
    Inductor, and the run trains with the compiled network, not the eager fallback that a
    failed compilation logs. The loss (its denoising pass included) runs eager, as for yolo."""
    with caplog.at_level(logging.ERROR, logger="falconet.train"):
        summary = Detector("detr-n").train(
            **tiny_run, epochs=1, graph="compile", amp_dtype="fp32", val="false"
        )
    assert summary["graph"] == "compile" and summary["epochs"] == 1
    assert not [r for r in caplog.records if "failed to compile" in r.getMessage()]
