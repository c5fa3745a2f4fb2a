"""The training loader of ``cache=gpu``: batches augmented on the GPU from the image store.

It yields what the CPU loader yields (:func:`falconet.data.loader.collate`'s keys), from the
same sampler (:class:`~falconet.data.loader.EpochBatchSampler`: the same batches, epochs,
shares of a distributed run, and mid-epoch resume), with the images already on the device:
``[B, 3, S, S]`` uint8, channels_last. Per batch:

* a host thread draws the plans (:mod:`falconet.data.plans`: the draws, the boxes through the
  warp, the lookup tables) and collates the padded targets, one batch ahead of the loop; it
  touches no CUDA stream (a copy it enqueued could meet a graph capture on the loop's thread);
* the loop's thread copies the plans to the device (pinned, asynchronous) and renders the
  images there (:func:`falconet.data.gpu_augment.render`): a few dozen kernels, no host sync.

The boxes stay a host computation on purpose: a batch's padded target shapes (its bucket) are
read on the host anyway, to pick a recording, and the numbers are then the CPU path's exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from falconet.data.gpu_augment import ImageStore, PlanTensors, render
from falconet.data.loader import (
    DetectionDataset,
    EpochBatchSampler,
    EpochSampler,
    collate_targets,
)
from falconet.data.plans import AugmentPlan


class GpuLoader:
    """Training batches of ``dataset`` rendered from ``store`` on its device (module
    docstring). ``dataset`` holds the samples (those in the store, in its order), the image
    size, the augmentation, the seed and ``close_mosaic``; its own pixels are never read."""

    def __init__(
        self,
        dataset: DetectionDataset,
        store: ImageStore,
        batch: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if dataset.augment is None:
            raise ValueError("GpuLoader trains: its dataset needs an augmentation")
        if len(store.shapes) != len(dataset):
            raise ValueError(
                f"the store holds {len(store.shapes)} images, the dataset {len(dataset)}"
            )
        self.dataset = dataset
        self.store = store
        self.device = store.pixels.device
        sampler = EpochSampler(
            len(dataset), shuffle=True, seed=seed, rank=rank, world_size=world_size
        )
        self.batch_sampler = EpochBatchSampler(sampler, batch)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def host_part(self, keys: list[tuple[int, int]]) -> tuple[list[AugmentPlan], dict[str, Any]]:
        """The plans and collated targets of one batch of ``(epoch, index)`` keys."""
        plans = [self.dataset.plan(epoch, index, self.store.shape) for epoch, index in keys]
        items = [
            self.dataset.item(index, plan.boxes, plan.labels, mosaic=plan.mosaic)
            for (_, index), plan in zip(keys, plans, strict=True)
        ]
        targets = collate_targets(items)
        if self.device.type == "cuda":
            targets = {k: v.pin_memory() for k, v in targets.items()}
        return plans, targets

    def device_part(self, plans: list[AugmentPlan], targets: dict[str, Any]) -> dict[str, Any]:
        """The batch with its images rendered on the device."""
        tensors = PlanTensors.from_plans(plans, self.device)
        return {"images": render(self.store, tensors, self.dataset.imgsz), **targets}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        keys = iter(self.batch_sampler)
        with ThreadPoolExecutor(1, thread_name_prefix="falconet-plans") as pool:
            ahead: Future | None = None
            first = next(keys, None)
            if first is not None:
                ahead = pool.submit(self.host_part, first)
            while ahead is not None:
                plans, targets = ahead.result()
                following = next(keys, None)
                ahead = None if following is None else pool.submit(self.host_part, following)
                yield self.device_part(plans, targets)
