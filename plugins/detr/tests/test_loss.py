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


def _batch():
    """detr-n's outputs for two 64-px images, 5 boxes in one and 2 in the other."""
    from falconet.data.targets import Targets, box_rows
    from falconet_detr.family import DetrFamily

    torch.manual_seed(0)
    net = DetrFamily().build_model("detr-n", 3)
    boxes = torch.zeros(2, 8, 4)
    boxes[0, :5] = torch.tensor(
        [[4, 4, 30, 30], [20, 30, 60, 62], [0, 40, 12, 64], [33, 2, 63, 20], [10, 10, 50, 50]]
    ).float()
    boxes[1, :2] = torch.tensor([[8, 8, 40, 24], [30, 30, 64, 64]]).float()
    labels = torch.randint(0, 3, (2, 8)) * (torch.arange(8) < torch.tensor([[5], [2]]))
    counts = torch.tensor([5, 2])
    targets = Targets(boxes, labels, counts, *box_rows(counts))
    with torch.no_grad():
        outputs = net(torch.rand(2, 3, 64, 64))
    return net, outputs, targets


def test_stacked_targets_hold_each_copy_as_its_own_images():
    from falconet_detr.loss import stacked_targets

    _, _, targets = _batch()
    stacked = stacked_targets(targets, 3)
    assert stacked.boxes.shape == (6, 8, 4) and stacked.counts.tolist() == [5, 2] * 3
    rows = targets.box_images.shape[0]
    for copy in range(3):
        images = stacked.box_images[copy * rows : (copy + 1) * rows]
        slots = stacked.box_slots[copy * rows : (copy + 1) * rows]
        real = targets.box_images < 2
        assert (images[real] == targets.box_images[real] + 2 * copy).all()
        assert (images[~real] == 6).all()  # padding rows point at no image
        torch.testing.assert_close(
            stacked.boxes[images[real], slots[real]],
            targets.boxes[targets.box_images[real], targets.box_slots[real]],
        )


def test_every_depth_is_scored_against_its_own_matching():
    """The loss's one stacked assigner call gives each decoder layer and the proposals the
    matching the assigner gives that depth alone: the loss equals one built from a call per
    depth. And the depths' matchings differ here, so one matching for all would not."""
    from falconet.contract import Predictions
    from falconet_detect.assigners import HUNGARIAN
    from falconet_detr.boxes import cxcywh_to_xyxy, xyxy_to_cxcywh
    from falconet_detr.loss import DENOISING_GROUPS, denoising_queries

    net, outputs, targets = _batch()
    # an untrained net's layers match alike: the first layer's queries are shifted by one, so
    # its matching is the others' shifted and a matching shared by every depth would be wrong
    logits, boxes = outputs.logits.clone(), outputs.boxes.clone()
    logits[0], boxes[0] = logits[0].roll(1, 1), boxes[0].roll(1, 1)
    outputs = outputs._replace(logits=logits, boxes=boxes)
    scale = outputs.scale
    torch.manual_seed(1)
    _, parts = DetrLoss(net, HUNGARIAN)(outputs, targets)

    torch.manual_seed(1)  # the same denoising draws
    dn = denoising_queries(targets, scale, outputs.logits.shape[-1], DENOISING_GROUPS)
    with torch.no_grad():
        dn_logits, dn_boxes = net.denoise(outputs.levels, dn)
    depths = [*zip(outputs.logits, outputs.boxes, strict=True)]
    depths.append((outputs.enc_logits, outputs.enc_boxes))
    queries = outputs.logits.shape[2]
    sums = dict.fromkeys(("vfl", "l1", "giou"), 0.0)
    foregrounds = []
    for logits, boxes in depths:
        predictions = Predictions(
            logits.float().sigmoid(),
            cxcywh_to_xyxy(boxes.float()) * scale,
            (scale[:2].max() / 2).expand(queries, 2),
            torch.ones(queries, 1),
        )
        matched = HUNGARIAN(predictions, targets)
        foregrounds.append(matched.foreground)
        terms = DetrLoss._terms(
            logits.float(),
            boxes.float(),
            matched.labels,
            xyxy_to_cxcywh(matched.boxes / scale),
            matched.foreground,
            torch.ones_like(matched.foreground),
        )
        for key in sums:
            sums[key] = sums[key] + terms[key]
    denoising = DetrLoss._terms(
        dn_logits.float(), dn_boxes.float(), dn.target_labels, dn.target_boxes, dn.positive, dn.real
    )
    norm = float(targets.counts.sum())
    for key in sums:
        expected = (sums[key] + denoising[key] / DENOISING_GROUPS) / norm
        torch.testing.assert_close(parts[key], expected, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(f, foregrounds[-2]) for f in foregrounds)
