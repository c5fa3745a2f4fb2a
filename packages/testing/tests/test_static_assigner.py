"""falconet-testing's third-party assigner, ``centre``: it passes the assigner contract (its
static declaration checked on shapes alone, and on the GPU machine under a CUDA graph) and
registers through a plugin like any other."""

from __future__ import annotations

import torch

from falconet_testing import static_assigner
from falconet_testing.contracts import AssignerContract
from falconet_testing.contracts.assigner import assigner_inputs
from falconet_testing.static_assigner import CentreAssigner


class TestCentreContract(AssignerContract):
    assigner = CentreAssigner()


def test_each_box_takes_its_nearest_anchors():
    predictions, targets = assigner_inputs(3)
    out = CentreAssigner(k=1)(predictions, targets)
    for b, count in enumerate(targets.counts.tolist()):
        centres = (targets.boxes[b, :count, :2] + targets.boxes[b, :count, 2:]) / 2
        nearest = torch.cdist(centres, predictions.anchor_points).argmin(1)
        assert set(out.foreground[b].nonzero().flatten().tolist()) == set(nearest.tolist())


def test_it_registers_through_a_plugin_and_declares_itself_static(
    falconet_plugins, add_falconet_plugin
):
    record = add_falconet_plugin(static_assigner, distribution="falconet-testing")
    assert record.status == "ok" and record.hooks == ["register_assigners"]
    entry = falconet_plugins.assigners.entry("centre")
    assert entry.provenance.distribution == "falconet-testing"
    assert entry.item.static_on(torch.device("cpu")) and entry.item.static_on(torch.device("cuda"))
