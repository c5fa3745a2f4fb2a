"""The YOLO loss: exact gradients, finite on padding, and it learns one real batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from falconet.data.targets import Targets
from falconet_detect.assigners import HUNGARIAN, SIMOTA, TAL
from falconet_detect.assigners.tal import TaskAlignedAssigner
from falconet_detect.family import YoloFamily
from falconet_detect.loss import YoloLoss
from falconet_detect.network import REG_MAX

COCO128 = Path(__file__).parents[4] / "shared" / "data" / "coco128" / "coco128.yaml"


def tiny_outputs(dtype=torch.float64):
    torch.manual_seed(0)
    ys, xs = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    anchors = (torch.stack((xs, ys), -1).reshape(-1, 2).to(dtype) + 0.5) * 8
    strides = torch.full((16, 1), 8.0, dtype=dtype)
    box = torch.randn(2, 16, 4 * REG_MAX, dtype=dtype, requires_grad=True)
    cls = torch.randn(2, 16, 3, dtype=dtype, requires_grad=True)
    boxes = torch.tensor(
        [[[2.0, 3.0, 20.0, 25.0], [0, 0, 0, 0]], [[10.0, 6.0, 30.0, 31.0], [1.0, 1.0, 9.0, 12.0]]],
        dtype=dtype,
    )
    targets = Targets.from_padded(boxes, torch.tensor([[2, 0], [0, 1]]), torch.tensor([1, 2]))
    return box, cls, anchors, strides, targets


@pytest.mark.parametrize(
    ("gains", "wrt"),
    [
        ({}, "cls"),  # every term, with respect to the class logits
        ({"box": 0.0}, "box"),  # DFL with respect to the box logits (CIoU: see below)
    ],
)
def test_gradients_match_finite_differences(gains, wrt):
    """The targets are constants of the step (the assigner runs without gradient), so the
    check holds the assignment of the unperturbed inputs fixed, as training does. CIoU's
    aspect weight alpha is a constant of the step too, as in the YOLO family, so the CIoU
    term's gradient is by design not the full derivative and is left out of the box check."""
    box, cls, anchors, strides, batch = tiny_outputs()
    assigner = TaskAlignedAssigner(topk=3)
    recorded = []

    def record(predictions, targets):
        recorded.append(assigner(predictions, targets))
        return recorded[0]

    YoloLoss(record)((box, cls, anchors, strides), batch)
    assert recorded[0].foreground.sum() > 0  # some anchors are positive: every term acts
    loss = YoloLoss(lambda predictions, targets: recorded[0], gains)

    def total(logits):
        outputs = (
            (logits, cls, anchors, strides) if wrt == "box" else (box, logits, anchors, strides)
        )
        return loss(outputs, batch)[0]

    assert torch.autograd.gradcheck(total, (box if wrt == "box" else cls,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("assigner", [TAL, SIMOTA, HUNGARIAN], ids=lambda a: a.name)
def test_loss_is_finite_positive_with_padding_and_empty_images(assigner):
    box, cls, anchors, strides, full = tiny_outputs(torch.float32)
    # image 0 without boxes, image 1 with one: the boxes past the counts are padding
    batch = Targets.from_padded(full.boxes, full.labels, torch.tensor([0, 1]))
    value, parts = YoloLoss(assigner)((box, cls, anchors, strides), batch)
    assert torch.isfinite(value) and value > 0
    assert set(parts) == {"box", "cls", "dfl"}
    value.backward()
    assert torch.isfinite(box.grad).all() and torch.isfinite(cls.grad).all()


@pytest.mark.skipif(not COCO128.exists(), reason=f"needs the shared COCO128 data at {COCO128}")
def test_overfits_one_coco128_batch(tmp_path, monkeypatch):
    """The loss falls by at least 80% within 60 steps on one real batch (yolo-n, 4 images at
    128 px: small enough for the CPU suite, with room under the bar for other seeds)."""
    monkeypatch.setenv("FALCONET_CACHE_DIR", str(tmp_path))
    from falconet.data import load_dataset
    from falconet.data.loader import DetectionDataset, collate

    samples = load_dataset(COCO128, splits=("train",)).splits["train"].samples[:4]
    batch = collate([DetectionDataset(samples, 128)[i] for i in range(4)])
    images, targets = batch["images"].float() / 255, Targets.from_batch(batch)
    torch.manual_seed(0)
    family = YoloFamily()
    net = family.build_model("yolo-n", 80)
    loss = family.build_loss(net, TaskAlignedAssigner())
    optimizer = torch.optim.AdamW(net.parameters(), lr=2e-3)
    first = last = None
    for _ in range(60):
        value, _ = loss(net(images), targets)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        first = value.item() if first is None else first
        last = value.item()
    assert last < 0.2 * first, (first, last)


@pytest.mark.parametrize("assigner", [TAL, SIMOTA, HUNGARIAN], ids=lambda a: a.name)
def test_loss_under_bf16_autocast_is_computed_in_fp32(assigner):
    """The network may run under autocast; the loss leaves it and computes in fp32 (the
    same value as outside autocast, from the same bf16 outputs)."""
    box, cls, anchors, strides, batch = tiny_outputs(torch.float32)
    outputs = (box.bfloat16(), cls.bfloat16(), anchors, strides)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside, _ = YoloLoss(assigner)(outputs, batch)
    outside, _ = YoloLoss(assigner)(outputs, batch)
    assert inside.dtype == torch.float32
    assert inside.item() == outside.item()


def two_gather_dfl(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The former DFL: one gather per bin."""
    left = target.long()
    right_weight = target - left
    log_probs = logits.log_softmax(-1)
    loss = -(
        log_probs.gather(-1, left[..., None]).squeeze(-1) * (1 - right_weight)
        + log_probs.gather(-1, (left + 1)[..., None]).squeeze(-1) * right_weight
    )
    return loss.mean(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dfl_with_one_gather_equals_one_gather_per_bin_with_its_gradient(dtype):
    """Targets across the whole range (0 and the clamp's top, 14.99, included): the value and
    the logits' gradient bit for bit the two-gather form's."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 300, 4, REG_MAX, generator=gen, dtype=dtype)
    target = torch.rand(2, 300, 4, generator=gen, dtype=dtype) * (REG_MAX - 1 - 0.01)
    target[0, :3] = 0.0
    target[1, :3] = REG_MAX - 1 - 0.01
    weight = torch.rand(2, 300, generator=gen, dtype=dtype)
    values, grads = [], []
    for fn in (two_gather_dfl, YoloLoss._dfl):
        x = logits.clone().requires_grad_()
        value = fn(x, target)
        (grad,) = torch.autograd.grad((value * weight).sum(), x)
        values.append(value.detach())
        grads.append(grad)
    assert torch.equal(values[0], values[1])
    assert torch.equal(grads[0], grads[1])
