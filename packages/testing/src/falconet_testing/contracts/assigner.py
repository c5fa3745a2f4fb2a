"""What every label assigner must do, on seeded random predictions and padded targets."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from falconet.interfaces import Assigner


def assigner_inputs(seed: int = 0) -> dict[str, Any]:
    """Three images on an 8x8 grid (stride 8, 64 anchors), 4 classes, up to 6 boxes each:
    image 0 has 3 boxes, image 1 none, image 2 six (no padding)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    anchors = (torch.stack((xs, ys), -1).reshape(-1, 2).float() + 0.5) * 8
    xy = torch.rand(3, 6, 2, generator=g) * 40
    gt_boxes = torch.cat((xy, xy + 8 + torch.rand(3, 6, 2, generator=g) * 16), -1)
    counts = torch.tensor([3, 0, 6])
    real = torch.arange(6)[None] < counts[:, None]
    gt_boxes = gt_boxes * real[..., None]  # padding rows are zeros, as the collate makes them
    gt_labels = torch.randint(0, 4, (3, 6), generator=g) * real
    half = 4 + torch.rand(3, 64, 2, generator=g) * 8
    pred_boxes = torch.cat((anchors - half, anchors + half), -1)
    return {
        "pred_scores": torch.rand(3, 64, 4, generator=g),
        "pred_boxes": pred_boxes,
        "anchor_points": anchors,
        "gt_boxes": gt_boxes,
        "gt_labels": gt_labels,
        "gt_counts": counts,
        "anchor_strides": torch.full((64, 1), 8.0),
    }


class AssignerContract:
    """Subclass with ``assigner`` (an instance your plugin registers)."""

    assigner: ClassVar[Assigner]

    @pytest.fixture(params=[0, 1, 2], ids=lambda s: f"seed{s}")
    def case(self, request: pytest.FixtureRequest) -> tuple[dict[str, Any], Any]:
        inputs = assigner_inputs(request.param)
        return inputs, self.assigner(**inputs)

    def test_shapes_and_dtypes(self, case) -> None:
        import torch

        inputs, out = case
        b, a, c = inputs["pred_scores"].shape
        assert out.labels.shape == (b, a) and out.labels.dtype == torch.int64
        assert out.boxes.shape == (b, a, 4) and out.scores.shape == (b, a, c)
        assert out.foreground.shape == (b, a)

    def test_each_anchor_is_assigned_at_most_once(self, case) -> None:
        _, out = case
        assert ((out.foreground == 0) | (out.foreground == 1)).all()
        assert (out.scores.gt(0).sum(-1) <= 1).all()  # one class target per anchor at most

    def test_foreground_anchors_get_a_real_box_of_their_image(self, case) -> None:
        inputs, out = case
        for b, count in enumerate(inputs["gt_counts"].tolist()):
            real = {
                (int(label), tuple(box.tolist()))
                for label, box in zip(
                    inputs["gt_labels"][b, :count], inputs["gt_boxes"][b, :count], strict=True
                )
            }
            for anchor in out.foreground[b].nonzero().flatten().tolist():
                pair = (int(out.labels[b, anchor]), tuple(out.boxes[b, anchor].tolist()))
                assert pair in real, (b, anchor, pair)
        assert out.foreground[0].sum() > 0 and out.foreground[2].sum() > 0

    def test_nothing_is_assigned_on_an_image_without_boxes(self, case) -> None:
        _, out = case
        assert out.foreground[1].sum() == 0 and out.scores[1].abs().sum() == 0

    def test_background_has_zero_class_targets(self, case) -> None:
        _, out = case
        background = out.foreground == 0
        assert out.scores[background].abs().sum() == 0
        assert (out.scores >= 0).all() and (out.scores <= 1 + 1e-6).all()

    def test_deterministic(self, case) -> None:
        import torch

        inputs, out = case
        again = self.assigner(**inputs)
        assert torch.equal(out.foreground, again.foreground)
        assert torch.equal(out.labels, again.labels) and torch.equal(out.scores, again.scores)

    @pytest.mark.parametrize("spare", [0, 8], ids=["rows", "padded-rows"])
    def test_box_rows_give_the_same_assignment(self, case, spare: int) -> None:
        """With the batch's real boxes passed as ``box_rows`` (``falconet.data.targets``),
        the assignment is the same bit for bit, also with padding rows beyond them."""
        import torch

        from falconet.data.targets import box_rows, takes_box_rows

        if not takes_box_rows(self.assigner):
            pytest.skip("this assigner takes no box_rows; losses call it without them")
        inputs, out = case
        images, slots = box_rows(inputs["gt_counts"])
        images = torch.cat((images, images.new_full((spare,), len(inputs["gt_counts"]))))
        slots = torch.cat((slots, slots.new_zeros(spare)))
        rows = self.assigner(**inputs, box_rows=(images, slots))
        for field in ("labels", "boxes", "scores", "foreground"):
            assert torch.equal(getattr(rows, field), getattr(out, field)), field
