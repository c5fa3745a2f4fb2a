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


def test_tal_per_box_breaks_ties_as_per_slot_does():
    """Two boxes in the same place, of different classes, claim anchors with the same IoU:
    per slot, ``argmax`` gives such an anchor to the first slot; the per-box form must pick
    the same slot (the labels tell them apart)."""
    from falconet.data.targets import box_rows

    inputs = assigner_inputs(7)
    inputs["gt_boxes"][2, 4] = inputs["gt_boxes"][2, 1]
    inputs["gt_labels"][2, 4] = (inputs["gt_labels"][2, 1] + 1) % 4
    per_slot = TAL(**inputs)
    per_box = TAL(**inputs, box_rows=box_rows(inputs["gt_counts"]))
    place = (per_slot.boxes[2] == inputs["gt_boxes"][2, 1]).all(-1)
    assert (per_slot.foreground[2] * place).sum() > 0  # the shared place has anchors
    for field in ("labels", "boxes", "scores", "foreground"):
        assert torch.equal(getattr(per_box, field), getattr(per_slot, field)), field
