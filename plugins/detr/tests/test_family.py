"""The detr family through falconet's contracts, its losses on awkward batches, the matcher's
known answer, and a tiny overfit through the trainer."""

from __future__ import annotations

import math

import pytest
import torch

from falconet.data.targets import Targets, box_rows
from falconet_detect.assigners import HUNGARIAN
from falconet_detr.family import DetrFamily
from falconet_detr.network import SCALES
from falconet_testing.contracts import FamilyContract, PluginContract


class TestDetrPlugin(PluginContract):
    plugin = "falconet_detr"
    distribution = "falconet-detr"


class TestDetrFamilyContract(FamilyContract):
    family = DetrFamily()
    model = "detr-n"
    assigner = HUNGARIAN
    steps = 120  # set prediction from scratch halves its loss more slowly than dense heads


def test_sizes_and_linear_dimensions_suit_fp8():
    family = DetrFamily()
    for model in SCALES:
        net = family.build_model(model, 80)
        for name, layer in net.named_modules():
            if isinstance(layer, torch.nn.Linear):
                # every dimension but a box's 4 coordinates (box heads' outputs, the query
                # position's input) is a multiple of 16, so an FP8 GEMM can take the layer
                dims = [d for d in (layer.in_features, layer.out_features) if d != 4]
                assert all(d % 16 == 0 for d in dims), name


def batch_of(
    boxes_per_image: list[list[list[float]]], size: int = 64
) -> tuple[torch.Tensor, Targets]:
    b = len(boxes_per_image)
    bucket = max(8, max((len(x) for x in boxes_per_image), default=0))
    boxes = torch.zeros(b, bucket, 4)
    labels = torch.zeros(b, bucket, dtype=torch.int64)
    for i, image in enumerate(boxes_per_image):
        if image:
            boxes[i, : len(image)] = torch.tensor(image)
            labels[i, : len(image)] = torch.arange(len(image)) % 3
    counts = torch.tensor([len(x) for x in boxes_per_image])
    images, slots = box_rows(counts)
    torch.manual_seed(0)
    return torch.rand(b, 3, size, size), Targets(boxes, labels, counts, images, slots)


@pytest.mark.parametrize(
    "boxes",
    [
        [[[4.0, 4.0, 30.0, 30.0]], []],  # one image without boxes
        [[], []],  # a whole batch without boxes
        [[[0.0, 0.0, 64.0, 64.0], [0.0, 50.0, 10.0, 64.0]], [[60.0, 0.0, 64.0, 3.0]]],  # borders
    ],
    ids=["an-empty-image", "an-empty-batch", "boxes-at-the-border"],
)
def test_awkward_batches_train_without_nan(boxes):
    family = DetrFamily()
    torch.manual_seed(0)
    net = family.build_model("detr-n", 3)
    images, targets = batch_of(boxes)
    loss = family.build_loss(net, HUNGARIAN)
    value, parts = loss(net(images), targets)
    value.backward()
    assert torch.isfinite(value) and all(torch.isfinite(v) for v in parts.values())
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)


def test_the_matcher_finds_the_known_optimal_assignment():
    """Three boxes, four queries; query 3 sits on box 0, query 0 on box 2, query 1 on box 1,
    and every query's class scores favour its own box's class: the cheapest one-to-one
    assignment is {3: 0, 1: 1, 0: 2}, query 2 left as background."""
    from falconet.contract import Predictions

    gt = torch.tensor(
        [[[10.0, 10.0, 20.0, 20.0], [40.0, 40.0, 60.0, 60.0], [0.0, 30.0, 15.0, 50.0]]]
    )
    labels = torch.tensor([[0, 1, 2]])
    boxes = torch.stack(
        [gt[0, 2], gt[0, 1] + 1, torch.tensor([70.0, 70.0, 90.0, 90.0]), gt[0, 0] - 1]
    )[None]
    scores = torch.full((1, 4, 3), 0.1)
    for query, label in ((3, 0), (1, 1), (0, 2)):
        scores[0, query, label] = 0.9
    counts = torch.tensor([3])
    images, slots = box_rows(counts)
    out = HUNGARIAN(
        Predictions(scores, boxes, torch.full((4, 2), 50.0), torch.ones(4, 1)),
        Targets(gt, labels, counts, images, slots),
    )
    assert out.foreground.tolist() == [[1.0, 1.0, 0.0, 1.0]]
    assert out.labels[0, [3, 1, 0]].tolist() == [0, 1, 2]
    assert torch.equal(out.boxes[0, [3, 1, 0]], gt[0])


def test_postprocess_scales_boxes_to_each_images_size():
    family = DetrFamily()
    logits = torch.full((1, 2, 3), -10.0)
    logits[0, 1, 2] = 10.0
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.25, 0.5, 0.5, 1.0]]])
    (det,) = family.postprocess((logits, boxes), [(40, 100)])
    assert det["labels"].tolist() == [2] and math.isclose(
        det["scores"].item(), torch.sigmoid(torch.tensor(10.0)).item()
    )
    assert det["boxes"].tolist() == [[0.0, 0.0, 50.0, 40.0]]


@pytest.mark.parametrize(
    ("model", "params", "gflops"),
    [("detr-n", (3.5e6, 3.65e6), (9.8, 10.3)), ("detr-s", (25.8e6, 26.0e6), (67.0, 68.5))],
)
def test_parameters_and_gflops_at_640(model, params, gflops):
    """docs/detr.md's table (FLOPs of ``torch.utils.flop_counter``: matrix products and
    convolutions, a multiply-add counting 2; ``grid_sample`` is not counted). The lower bounds
    leave room for torch versions whose counter has no formula for the CPU attention kernel
    (torch 2.11 counts 0.22 / 0.72 GFLOPs less than 2.15 here, the attention's share)."""
    from torch.utils.flop_counter import FlopCounterMode

    net = DetrFamily().build_model(model, 80).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(torch.zeros(1, 3, 640, 640))
    assert params[0] < sum(p.numel() for p in net.parameters()) < params[1]
    assert gflops[0] < counter.get_total_flops() / 1e9 < gflops[1]


@pytest.mark.parametrize("loss_under_autocast", [False, True])
def test_after_a_bf16_forward_the_denoising_pass_runs_in_bf16_and_the_loss_in_fp32(
    loss_under_autocast,
):
    """The loop calls the loss outside the forward's autocast (EagerStep); a caller may not."""
    family = DetrFamily()
    torch.manual_seed(0)
    net = family.build_model("detr-n", 3)
    images, targets = batch_of([[[4.0, 4.0, 30.0, 30.0]], [[10.0, 20.0, 50.0, 60.0]]])
    with torch.autocast("cpu", torch.bfloat16):
        outputs = net(images)
    with torch.autocast("cpu", torch.bfloat16, enabled=loss_under_autocast):
        value, _ = family.build_loss(net, HUNGARIAN)(outputs, targets)
    assert outputs.logits.dtype == torch.bfloat16 and value.dtype == torch.float32
    value.backward()
    assert torch.isfinite(value)
