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


def test_denoising_weighs_as_one_matched_set_whatever_the_group_count(monkeypatch):
    """Each denoising group holds every box once, so the denoising terms are divided by the
    box count times the groups (RT-DETR's normalisation): with noise-free groups, which then
    denoise identically, the loss does not change with the number of groups."""
    import functools

    from falconet.data.targets import Targets, box_rows
    from falconet_detect.assigners import HUNGARIAN
    from falconet_detr import loss as loss_module
    from falconet_detr.family import DetrFamily

    noise_free = functools.partial(loss_module.denoising_queries, label_noise=0.0, box_noise=0.0)
    monkeypatch.setattr(loss_module, "denoising_queries", noise_free)
    torch.manual_seed(0)
    net = DetrFamily().build_model("detr-n", 3)  # no dropout: every group sees the same net
    boxes = torch.zeros(2, 8, 4)
    boxes[0, :2] = torch.tensor([[4.0, 4.0, 30.0, 30.0], [20.0, 30.0, 60.0, 62.0]])
    labels = torch.zeros(2, 8, dtype=torch.int64)
    labels[0, 1] = 2
    counts = torch.tensor([2, 0])  # the second image without boxes
    targets = Targets(boxes, labels, counts, *box_rows(counts))
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        outputs = net(images)
        totals = [DetrLoss(net, HUNGARIAN, groups=g)(outputs, targets)[0] for g in (1, 3)]
    torch.testing.assert_close(totals[0], totals[1], rtol=1e-4, atol=1e-5)
