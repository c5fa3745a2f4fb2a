"""Query groups (Group DETR): attention blind across groups (a known answer), one group the
one-group loss bit for bit (the code before groups, written out), each group matched on its own
(a slow reference: one assigner call per depth and group), inference unchanged by the groups,
the key's way from a run's keys to the network, and a tiny overfit with three groups. Every
network here is a tiny scale, on one thread: each test takes a few seconds on two cores."""

from __future__ import annotations

import pytest
import torch

from falconet.contract import Predictions
from falconet.data.targets import Targets, box_rows
from falconet_detect.assigners import HUNGARIAN
from falconet_detr.attention import Attention
from falconet_detr.boxes import cxcywh_to_xyxy, xyxy_to_cxcywh
from falconet_detr.denoising import denoising_queries
from falconet_detr.family import DetrFamily
from falconet_detr.loss import DetrLoss, stacked_targets
from falconet_detr.network import DetrNet, DetrOutputs, Scale, anchor_logits, flatten

TINY = Scale((8, 16, 16, 32), 1, 32, 4, 64, 1, 2, queries=16, points=2)


@pytest.fixture(autouse=True)
def one_thread():
    """One thread: on a shared two-core machine a second one only contends."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_batch(b: int = 4) -> tuple[torch.Tensor, Targets]:
    """``b`` 64 px images, 1-3 boxes each (class 0-2), each box painted into its class's
    channel so the set can be learned."""
    torch.manual_seed(1)
    corner = torch.rand(b, 3, 2) * 30
    boxes = torch.cat((corner, corner + 12 + torch.rand(b, 3, 2) * 18), -1)
    labels = torch.randint(0, 3, (b, 3))
    counts = torch.tensor([3, 2, 1, 3][:b])
    images = torch.rand(b, 3, 64, 64) * 0.5
    for i in range(b):
        for k in range(int(counts[i])):
            x0, y0, x1, y1 = boxes[i, k].long().tolist()
            images[i, labels[i, k], y0:y1, x0:x1] += 0.5
    box_images, box_slots = box_rows(counts)
    return images, Targets(boxes, labels, counts, box_images, box_slots)


def tiny_net(groups: int) -> DetrNet:
    torch.manual_seed(0)
    return DetrNet(TINY, 3, groups).train()


def test_each_group_attends_only_within_itself():
    """The folded attention is attention under the block-diagonal mask, and changing one
    group's queries leaves the other groups' outputs exactly as they were."""
    torch.manual_seed(0)
    attention = Attention(16, heads=2).double()
    groups, queries = 3, 4
    x = torch.randn(2, groups * queries, 16, dtype=torch.float64)
    got = attention(x, x, x, groups=groups)
    group = torch.arange(groups * queries) // queries
    mask = group[:, None] == group[None, :]  # [T, T]: True within a group
    assert mask.sum() == groups * queries**2 and mask[0, queries - 1] and not mask[0, queries]
    expected = attention(x, x, x, mask[None, None].expand(2, 1, -1, -1))
    assert (got - expected).abs().max() < 1e-12
    changed = x.clone()
    changed[:, queries : 2 * queries] += 1.0  # group 1 only
    again = attention(changed, changed, changed, groups=groups)
    assert torch.equal(again[:, :queries], got[:, :queries])
    assert torch.equal(again[:, 2 * queries :], got[:, 2 * queries :])
    assert not torch.allclose(again[:, queries : 2 * queries], got[:, queries : 2 * queries])
    with pytest.raises(ValueError, match="mask and query groups"):
        attention(x, x, x, mask[None, None], groups=groups)


def one_group_forward(net: DetrNet, images: torch.Tensor) -> DetrOutputs:
    """The training forward as it was before query groups, on ``net``'s own modules."""
    levels = tuple(net.encoder(net.backbone(images)))
    memory, shapes = flatten(levels)
    features = net.proposal(memory)
    scores = net.proposal_scores(features)
    box_logits = net.proposal_boxes(features) + anchor_logits(shapes, features)
    top = scores.max(-1).values.topk(min(net.queries, scores.shape[1]), 1).indices
    enc_logits = scores.gather(1, top[..., None].expand(-1, -1, scores.shape[-1]))
    enc_box_logits = box_logits.gather(1, top[..., None].expand(-1, -1, 4))
    queries = features.gather(1, top[..., None].expand(-1, -1, features.shape[-1]))
    logits, boxes = net.decoder(queries.detach(), enc_box_logits.detach(), memory, shapes)
    h, w = images.shape[-2:]
    scale = torch.stack([images.new_full((), float(v)) for v in (w, h, w, h)]).float()
    return DetrOutputs(logits, boxes, enc_logits, enc_box_logits.sigmoid(), levels, scale)


def one_group_loss(net: DetrNet, outputs: DetrOutputs, targets: Targets):
    """The loss as it was before query groups (``DetrLoss._loss`` then), its parts."""
    dn = denoising_queries(targets, outputs.scale, outputs.logits.shape[-1], 5)
    dn_logits, dn_boxes = net.denoise(outputs.levels, dn)
    scale = outputs.scale
    logits, boxes = outputs.logits.float(), outputs.boxes.float()
    depths, batch, queries = logits.shape[:3]
    all_logits = torch.cat((logits, outputs.enc_logits.float()[None])).detach()
    all_boxes = torch.cat((boxes, outputs.enc_boxes.float()[None])).detach()
    predictions = Predictions(
        all_logits.sigmoid().flatten(0, 1),
        cxcywh_to_xyxy(all_boxes).flatten(0, 1) * scale,
        (scale[:2].max() / 2).expand(queries, 2),
        torch.ones(queries, 1),
    )
    matched = HUNGARIAN(predictions, stacked_targets(targets, depths + 1))
    shape = (depths + 1, batch, queries)
    labels, foreground = matched.labels.view(shape), matched.foreground.view(shape)
    target_boxes = xyxy_to_cxcywh(matched.boxes.view(*shape, 4) / scale)
    everything = torch.ones_like(foreground)
    norm = targets.counts.sum().float().clamp(min=1.0)
    terms = DetrLoss._terms
    matched = terms(logits, boxes, labels[:-1], target_boxes[:-1], foreground[:-1], everything[:-1])
    proposals = terms(
        outputs.enc_logits.float(),
        outputs.enc_boxes.float(),
        labels[-1],
        target_boxes[-1],
        foreground[-1],
        everything[-1],
    )
    denoising = terms(
        dn_logits.float(), dn_boxes.float(), dn.target_labels, dn.target_boxes, dn.positive, dn.real
    )
    return {k: (matched[k] + proposals[k] + denoising[k] / 5) / norm for k in ("vfl", "l1", "giou")}


def test_one_group_is_the_loss_before_groups_bit_for_bit():
    images, targets = tiny_batch()
    net = tiny_net(1)
    reference = tiny_net(1)
    assert not list(net.group_proposals.parameters())  # the state dict of before
    torch.manual_seed(2)  # the same denoising draws for both
    total, parts = DetrLoss(net, HUNGARIAN)(net(images), targets)
    total.backward()
    torch.manual_seed(2)
    expected = one_group_loss(reference, one_group_forward(reference, images), targets)
    sum(w * expected[k] for k, w in DetrLoss(reference, HUNGARIAN).weights.items()).backward()
    for key, value in expected.items():
        assert torch.equal(parts[key], value.detach()), key
    pairs = zip(net.named_parameters(), reference.parameters(), strict=True)
    for (name, got), want in pairs:
        assert (got.grad is None) == (want.grad is None), name
        assert got.grad is None or torch.equal(got.grad, want.grad), name


def test_each_group_is_matched_to_the_boxes_on_its_own():
    """Against one assigner call per depth and group, each on that group's queries alone;
    each group's terms averaged over the groups."""
    images, targets = tiny_batch()
    groups = 3
    net = tiny_net(groups)
    outputs = net(images)
    assert outputs.logits.shape[2] == outputs.enc_logits.shape[1] == groups * TINY.queries
    torch.manual_seed(2)
    _, parts = DetrLoss(net, HUNGARIAN)(outputs, targets)

    torch.manual_seed(2)  # the same denoising draws
    dn = denoising_queries(targets, outputs.scale, 3, 5)
    with torch.no_grad():
        dn_logits, dn_boxes = net.denoise(outputs.levels, dn)
    scale, q = outputs.scale, TINY.queries
    depths = [*zip(outputs.logits, outputs.boxes, strict=True)]
    depths.append((outputs.enc_logits, outputs.enc_boxes))
    sums = dict.fromkeys(("vfl", "l1", "giou"), 0.0)
    foregrounds = []
    for logits, boxes in depths:
        for g in range(groups):
            mine = slice(g * q, (g + 1) * q)
            group_logits, group_boxes = logits[:, mine].float(), boxes[:, mine].float()
            predictions = Predictions(
                group_logits.detach().sigmoid(),
                cxcywh_to_xyxy(group_boxes.detach()) * scale,
                (scale[:2].max() / 2).expand(q, 2),
                torch.ones(q, 1),
            )
            matched = HUNGARIAN(predictions, targets)
            foregrounds.append(matched.foreground)
            terms = DetrLoss._terms(
                group_logits,
                group_boxes,
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
        expected = (sums[key] / groups + denoising[key] / 5) / norm
        # (torch.testing's first import alone costs seconds here)
        assert abs(parts[key].item() - expected.item()) <= 1e-6 + 1e-5 * abs(expected.item())
    # every group of a depth holds each box once, and the groups' matchings differ
    assert all(f.sum() == targets.counts.sum() for f in foregrounds)
    assert any(not torch.equal(foregrounds[0], f) for f in foregrounds[1:groups])


def test_inference_runs_group_zero_alone_whatever_the_group_count():
    images, _ = tiny_batch(2)
    one, three = tiny_net(1).eval(), tiny_net(3).eval()
    own = one.state_dict()
    extra = {k: v for k, v in three.state_dict().items() if k not in own}
    assert extra and all(k.startswith("group_proposals.") for k in extra)
    # group 0 and the rest start from the same weights (the extra heads are made last)
    assert all(torch.equal(v, three.state_dict()[k]) for k, v in own.items())
    calls = []
    for head in three.group_proposals:
        head.register_forward_hook(lambda *_: calls.append(1))
    seen = []
    three.decoder.layers[0].register_forward_hook(lambda m, args, out: seen.append(out.shape))
    with torch.no_grad():
        a, b = one(images), three(images)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert a[0].shape == (2, TINY.queries, 3) and seen == [(2, TINY.queries, TINY.dim)]
    assert not calls  # no other group's head ran
    # a checkpoint of three groups predicts in a model of one: the training-only heads drop
    loaded = tiny_net(1).eval()
    torch.manual_seed(5)
    trained = three.state_dict()
    loaded.load_state_dict(
        {k: torch.randn_like(v) if k in extra else v for k, v in trained.items()}
    )
    with torch.no_grad():
        assert all(torch.equal(x, y) for x, y in zip(loaded(images), b, strict=True))
    with pytest.raises(RuntimeError, match="group_proposals"):
        tiny_net(3).load_state_dict(own)  # one group's weights lack the other groups' heads


def test_the_key_reaches_the_network_and_the_loss(installed_falconet_plugins, tmp_path):
    from falconet.training.planning import plan_run

    data = tmp_path / "data.yaml"
    data.write_text("path: .\ntrain: images\nval: images\nnames: [a, b]\n")
    keys = {"model": "detr-n", "data": str(data), "device": "cpu"}
    default = plan_run(keys, installed_falconet_plugins)
    assert default.config.query_groups == 1 and default.family.query_groups == 1
    plan = plan_run({**keys, "query_groups": "3"}, installed_falconet_plugins)
    assert plan.config.query_groups == 3 and plan.family.query_groups == 3
    assert DetrFamily(3).build_model("detr-n", 2).query_groups == 3
    with pytest.raises(Exception, match="query_groups"):
        plan_run({**keys, "query_groups": "0"}, installed_falconet_plugins)


def test_three_groups_overfit_a_tiny_set():
    images, targets = tiny_batch(2)
    net = tiny_net(3)
    loss = DetrLoss(net, HUNGARIAN)
    optimizer = torch.optim.AdamW(net.parameters(), lr=4e-3)
    values = []
    for _ in range(16):
        value, _ = loss(net(images), targets)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        values.append(value.item())
    assert sum(values[-3:]) / 3 < 0.8 * values[0], [round(v, 2) for v in values]
