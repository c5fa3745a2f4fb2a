"""Every registered assigner passes the assigner contract; SimOTA and Hungarian by hand."""

from __future__ import annotations

import pytest
import torch

from falconet_detect.assigners import HUNGARIAN, SIMOTA, TAL
from falconet_testing.contracts import AssignerContract
from falconet_testing.contracts.assigner import assigner_inputs


class TestTalContract(AssignerContract):
    assigner = TAL


class TestSimOTAContract(AssignerContract):
    assigner = SIMOTA


class TestHungarianContract(AssignerContract):
    assigner = HUNGARIAN


def test_hungarian_gives_every_box_exactly_one_anchor():
    inputs = assigner_inputs(5)
    out = HUNGARIAN(**inputs)
    assert out.foreground.sum(1).tolist() == inputs["gt_counts"].float().tolist()
    for b, count in enumerate(inputs["gt_counts"].tolist()):
        owners = {tuple(box.tolist()) for box in out.boxes[b][out.foreground[b] > 0]}
        assert owners == {tuple(box.tolist()) for box in inputs["gt_boxes"][b, :count]}


def test_hungarian_picks_the_anchor_that_predicts_the_box():
    inputs = assigner_inputs(6)
    target = inputs["gt_boxes"][0, 0].clone()
    inputs["pred_boxes"][0, 27] = target  # anchor 27 predicts box 0 exactly, with confidence
    inputs["pred_scores"][0, 27, inputs["gt_labels"][0, 0]] = 1.0
    out = HUNGARIAN(**inputs)
    assert out.foreground[0, 27] == 1 and torch.equal(out.boxes[0, 27], target)


def test_simota_dynamic_k_grows_with_the_quality_of_predictions():
    inputs = assigner_inputs(7)
    poor = SIMOTA(**inputs).foreground[0].sum()
    for anchor in range(64):  # every anchor predicts image 0's first box exactly
        inputs["pred_boxes"][0, anchor] = inputs["gt_boxes"][0, 0]
    good = SIMOTA(**inputs).foreground[0].sum()
    assert good > poor


def test_simota_needs_strides():
    inputs = assigner_inputs(0)
    inputs.pop("anchor_strides")
    with pytest.raises(ValueError, match="simota needs anchor_strides"):
        SIMOTA(**inputs)
