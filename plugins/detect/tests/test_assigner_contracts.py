"""Every registered assigner passes the assigner contract; SimOTA and Hungarian by hand."""

from __future__ import annotations

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
    predictions, targets = assigner_inputs(5)
    out = HUNGARIAN(predictions, targets)
    assert out.foreground.sum(1).tolist() == targets.counts.float().tolist()
    for b, count in enumerate(targets.counts.tolist()):
        owners = {tuple(box.tolist()) for box in out.boxes[b][out.foreground[b] > 0]}
        assert owners == {tuple(box.tolist()) for box in targets.boxes[b, :count]}


def test_hungarian_picks_the_anchor_that_predicts_the_box():
    predictions, targets = assigner_inputs(6)
    target = targets.boxes[0, 0].clone()
    predictions.boxes[0, 27] = target  # anchor 27 predicts box 0 exactly, with confidence
    predictions.scores[0, 27, targets.labels[0, 0]] = 1.0
    out = HUNGARIAN(predictions, targets)
    assert out.foreground[0, 27] == 1 and torch.equal(out.boxes[0, 27], target)


def test_simota_dynamic_k_grows_with_the_quality_of_predictions():
    predictions, targets = assigner_inputs(7)
    poor = SIMOTA(predictions, targets).foreground[0].sum()
    predictions.boxes[0, :] = targets.boxes[0, 0]  # every anchor predicts image 0's first box
    good = SIMOTA(predictions, targets).foreground[0].sum()
    assert good > poor
