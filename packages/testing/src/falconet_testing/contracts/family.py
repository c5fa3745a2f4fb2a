"""What every model family must do, on a small synthetic batch (CPU, seconds)."""

from __future__ import annotations

import io
from typing import Any, ClassVar

from falconet.interfaces import Assigner, ModelFamily


def tiny_batch(size: int = 64, classes: int = 3) -> dict[str, Any]:
    """Two images with a bright square each, padded targets as the collate makes them
    (``images``, and the :data:`falconet.data.targets.TARGET_KEYS`)."""
    import torch

    from falconet.data.targets import box_rows

    images = torch.zeros(2, 3, size, size)
    images[0, :, 8:40, 8:40] = 1.0
    images[1, 0, 20:60, 16:48] = 1.0
    counts = torch.tensor([1, 1])
    images_of_boxes, slots = box_rows(counts)
    return {
        "images": images,
        "boxes": torch.tensor(
            [[[8.0, 8.0, 40.0, 40.0], [0, 0, 0, 0]], [[16.0, 20.0, 48.0, 60.0], [0, 0, 0, 0]]]
        ),
        "labels": torch.tensor([[1, 0], [classes - 1, 0]]),
        "counts": counts,
        "box_images": images_of_boxes,
        "box_slots": slots,
    }


class FamilyContract:
    """Subclass with ``family``, ``model`` (one of its model names) and ``assigner``."""

    family: ClassVar[ModelFamily]
    model: ClassVar[str]
    assigner: ClassVar[Assigner]
    steps: ClassVar[int] = 40

    def _build(self, classes: int = 3) -> Any:
        import torch

        torch.manual_seed(0)
        return self.family.build_model(self.model, classes)

    def test_declares_itself(self) -> None:
        assert isinstance(self.family, ModelFamily)
        assert self.model in self.family.models
        assert isinstance(self.family.priority, int)  # ranks it for the default model
        recipe = self.family.default_recipe(self.model)
        assert {"optimizer", "lr0", "imgsz", "assigner"} <= set(recipe)  # the core names none

    def test_loss_is_finite_and_positive(self) -> None:
        import torch

        from falconet.data.targets import Targets

        net = self._build()
        batch = tiny_batch()
        targets = Targets.from_batch(batch)
        value, parts = self.family.build_loss(net, self.assigner)(net(batch["images"]), targets)
        assert value.ndim == 0 and torch.isfinite(value) and value > 0
        assert all(torch.isfinite(v) for v in parts.values())

    def test_loss_falls_when_overfitting_one_batch(self) -> None:
        import torch

        from falconet.data.targets import Targets

        net = self._build()
        batch = tiny_batch()
        targets = Targets.from_batch(batch)
        loss = self.family.build_loss(net, self.assigner)
        optimizer = torch.optim.AdamW(net.parameters(), lr=2e-3)
        values = []
        for _ in range(self.steps):
            value, _ = loss(net(batch["images"]), targets)
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
            values.append(value.item())
        assert values[-1] < 0.5 * values[0], values[:: max(1, self.steps // 8)]

    def test_state_dict_round_trip(self) -> None:
        import torch

        net = self._build().eval()
        buffer = io.BytesIO()
        torch.save(net.state_dict(), buffer)
        buffer.seek(0)
        other = self.family.build_model(self.model, 3).eval()
        other.load_state_dict(torch.load(buffer, weights_only=True))
        images = tiny_batch()["images"]
        with torch.no_grad():
            for a, b in zip(net(images), other(images), strict=True):
                assert torch.equal(a, b)

    def test_postprocess_gives_the_detection_contract(self) -> None:
        import torch

        net = self._build().eval()
        with torch.no_grad():
            detections = self.family.postprocess(net(tiny_batch()["images"]), [(64, 64)] * 2)
        assert len(detections) == 2
        for det in detections:
            assert set(det) == {"boxes", "scores", "labels"}
            assert det["boxes"].shape[-1] == 4 and len(det["scores"]) == len(det["labels"])

    def test_capture_region_is_a_module_or_none(self) -> None:
        import torch

        net = self._build()
        region = self.family.capture_region(net)
        assert region is None or isinstance(region, torch.nn.Module)
