"""The DETR loss's terms over a leading layer dimension equal the per-layer terms summed."""

from __future__ import annotations

import torch

from falconet_detr.loss import DetrLoss


def test_terms_over_stacked_layers_are_the_sum_of_each_layers_terms():
    torch.manual_seed(0)
    layers, batch, queries, classes = 3, 2, 7, 5
    logits = torch.randn(layers, batch, queries, classes, dtype=torch.float64)
    centres = torch.rand(layers, batch, queries, 2, dtype=torch.float64) * 0.6 + 0.2
    sizes = torch.rand(layers, batch, queries, 2, dtype=torch.float64) * 0.3 + 0.05
    boxes = torch.cat((centres, sizes), -1)
    labels = torch.randint(0, classes, (batch, queries))
    target_boxes = boxes[0].flip(1).clone()  # [B, Q, 4], some far from their queries
    positive = (torch.rand(batch, queries) < 0.5).double()
    counted = torch.ones(batch, queries, dtype=torch.float64)
    counted[1, -2:] = 0  # padding a loss must not read

    stacked = DetrLoss._terms(logits, boxes, labels, target_boxes, positive, counted)
    each = [
        DetrLoss._terms(logits[i], boxes[i], labels, target_boxes, positive, counted)
        for i in range(layers)
    ]
    for key in ("vfl", "l1", "giou"):
        expected = sum(t[key] for t in each)
        torch.testing.assert_close(stacked[key], expected, rtol=1e-12, atol=1e-12)
        assert expected > 0  # every term has something to sum here
