"""What every model family must do, on a small synthetic batch (CPU, seconds)."""

from __future__ import annotations

import io
from typing import Any, ClassVar

from falconet.contract import Assigner, ModelFamily


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

    def test_grad_checkpoint_changes_no_number(self) -> None:
        """A family that checkpoints (:class:`falconet.contract.CheckpointingFamily`): two
        SGD steps with every region checkpointed leave the loss, every gradient, weight and
        buffer (BatchNorm's running statistics among them) as they are without, bit for bit:
        the recomputation runs the same kernels on the same inputs and autograd's graph keeps
        its order, so equality is exact (eager, CPU)."""
        import pytest
        import torch

        from falconet.contract import CheckpointingFamily
        from falconet.data.targets import Targets

        if not isinstance(self.family, CheckpointingFamily):
            pytest.skip("the family declares no grad_checkpoint regions")
        every = "+".join(self.family.grad_checkpoint_regions)
        batch = tiny_batch()
        targets = Targets.from_batch(batch)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a shared machine's second core only contends
        try:
            runs, kept = self._train_twice(("off", every), batch, targets)
        finally:
            torch.set_num_threads(threads)
        (loss0, grads0, state0), (loss1, grads1, state1) = runs
        assert kept[1] < kept[0]  # the checkpointed blocks kept their inputs only
        assert torch.equal(loss0, loss1)
        assert grads0.keys() == grads1.keys() and grads0
        assert all(torch.equal(grads0[n], grads1[n]) for n in grads0)
        assert [n for n in state0 if not torch.equal(state0[n], state1[n])] == []

    def _train_twice(self, values: tuple[str, ...], batch: dict, targets: Any) -> tuple:
        """Per ``grad_checkpoint`` value: two SGD steps' last loss, gradients and state, and
        the elements autograd kept outside checkpointed blocks in the first forward."""
        import torch

        configure = self.family.configure  # a checkpointing family reads the key there
        runs, kept = [], []
        for value in values:
            family = configure({"grad_checkpoint": value})
            torch.manual_seed(0)
            net = family.build_model(self.model, 3).train()
            loss = family.build_loss(net, self.assigner)
            optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
            for step in range(2):  # the second step's gradients come from updated weights
                torch.manual_seed(1)  # the loss's own draws (denoising queries), alike
                saved: list[int] = []  # what autograd keeps outside checkpointed blocks
                with torch.autograd.graph.saved_tensors_hooks(
                    lambda t, saved=saved: saved.append(t.numel()) or t, lambda t: t
                ):
                    total, _ = loss(net(batch["images"]), targets)
                if step == 0:
                    kept.append(sum(saved))
                optimizer.zero_grad()
                total.backward()
                optimizer.step()
            grads = {n: p.grad for n, p in net.named_parameters() if p.grad is not None}
            runs.append((total.detach(), grads, net.state_dict()))
        return runs, kept
