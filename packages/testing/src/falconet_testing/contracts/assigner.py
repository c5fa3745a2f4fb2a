"""What every label assigner must do, on seeded random predictions and padded targets, and
that what it declares static (:meth:`falconet.contract.Assigner.static_on`) is so."""

from __future__ import annotations

from dataclasses import astuple
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

from falconet.contract import Assigner

if TYPE_CHECKING:
    from falconet.contract import Predictions
    from falconet.data.targets import Targets


def assigner_inputs(seed: int = 0) -> tuple[Predictions, Targets]:
    """Three images on an 8x8 grid (stride 8, 64 anchors), 4 classes, up to 6 boxes each:
    image 0 has 3 boxes, image 1 none, image 2 six (no padding slots)."""
    import torch

    from falconet.contract import Predictions
    from falconet.data.targets import Targets

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
    predictions = Predictions(
        scores=torch.rand(3, 64, 4, generator=g),
        boxes=pred_boxes,
        anchor_points=anchors,
        anchor_strides=torch.full((64, 1), 8.0),
    )
    return predictions, Targets.from_padded(gt_boxes, gt_labels, counts)


def inputs_on(device: Any, seed: int = 0) -> tuple[Predictions, Targets]:
    """:func:`assigner_inputs` on ``device`` (``"meta"``: their shapes alone, no values)."""
    from falconet.contract import Predictions

    predictions, targets = assigner_inputs(seed)
    return Predictions(*(t.to(device) for t in astuple(predictions))), targets.to(device)


class AssignerContract:
    """Subclass with ``assigner`` (an instance your plugin registers)."""

    assigner: ClassVar[Assigner]

    @pytest.fixture(params=[0, 1, 2], ids=lambda s: f"seed{s}")
    def case(self, request: pytest.FixtureRequest) -> tuple[tuple[Predictions, Targets], Any]:
        inputs = assigner_inputs(request.param)
        return inputs, self.assigner(*inputs)

    def test_shapes_and_dtypes(self, case) -> None:
        import torch

        (predictions, _), out = case
        b, a, c = predictions.scores.shape
        assert out.labels.shape == (b, a) and out.labels.dtype == torch.int64
        assert out.boxes.shape == (b, a, 4) and out.scores.shape == (b, a, c)
        assert out.foreground.shape == (b, a)

    def test_each_anchor_is_assigned_at_most_once(self, case) -> None:
        _, out = case
        assert ((out.foreground == 0) | (out.foreground == 1)).all()
        assert (out.scores.gt(0).sum(-1) <= 1).all()  # one class target per anchor at most

    def test_foreground_anchors_get_a_real_box_of_their_image(self, case) -> None:
        (_, targets), out = case
        for b, count in enumerate(targets.counts.tolist()):
            real = {
                (int(label), tuple(box.tolist()))
                for label, box in zip(
                    targets.labels[b, :count], targets.boxes[b, :count], strict=True
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
        again = self.assigner(*inputs)
        assert torch.equal(out.foreground, again.foreground)
        assert torch.equal(out.labels, again.labels) and torch.equal(out.scores, again.scores)

    def test_declares_where_it_is_static(self) -> None:
        import torch

        for device in (torch.device("cpu"), torch.device("cuda", 0)):  # asked, not used
            static = self.assigner.static_on(device)
            assert isinstance(static, bool), f"static_on({device}) is a bool, got {static!r}"

    def test_static_on_the_cpu_runs_on_shapes_alone(self) -> None:
        """Declared static on the CPU, it runs on ``meta`` tensors, which have shapes and no
        values: an op whose output shape depends on the data (``nonzero``, a boolean mask)
        or a read back to the host (``item``, ``tolist``, ``numpy``) fails there."""
        import torch

        if not self.assigner.static_on(torch.device("cpu")):
            pytest.skip(f"{self.assigner.name} does not declare itself static on the CPU")
        predictions, targets = inputs_on("cpu")
        want = self.assigner(predictions, targets)
        got = self.assigner(*inputs_on("meta"))
        for field in ("labels", "boxes", "scores", "foreground"):
            a, b = getattr(want, field), getattr(got, field)
            assert (b.device.type, b.shape, b.dtype) == ("meta", a.shape, a.dtype), field

    @pytest.mark.gpu
    def test_static_on_a_gpu_reads_nothing_back_and_replays_from_a_cuda_graph(self) -> None:
        """Declared static on a CUDA device, it runs with CUDA's sync debug mode set to error
        (a read back to the host raises) and, recorded in a CUDA graph, its replay gives the
        assignment it gives eagerly."""
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU; the GPU machine runs it")
        device = torch.device("cuda", torch.cuda.current_device())
        if not self.assigner.static_on(device):
            pytest.skip(f"{self.assigner.name} does not declare itself static on {device}")
        inputs = inputs_on(device)
        self.assigner(*inputs)  # kernels built and libraries loaded before the checked call
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            want = self.assigner(*inputs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            recorded = self.assigner(*inputs)
        graph.replay()
        for field in ("labels", "boxes", "scores", "foreground"):
            assert torch.equal(getattr(recorded, field), getattr(want, field)), field

    @pytest.mark.parametrize("bucket", [(6, 32), (16, 16), (16, 32)], ids=str)
    def test_padding_to_a_larger_bucket_changes_nothing(self, case, bucket) -> None:
        """The same targets padded to a larger bucket (more slots per image, more rows of
        no image: :meth:`falconet.data.targets.Targets.padded`) give the same assignment
        bit for bit: a graph backend replays a batch in a larger recorded bucket."""
        import torch

        (predictions, targets), out = case
        padded = self.assigner(predictions, targets.padded(bucket))
        assert targets.padded(bucket).bucket == bucket
        for field in ("labels", "boxes", "scores", "foreground"):
            assert torch.equal(getattr(padded, field), getattr(out, field)), field
