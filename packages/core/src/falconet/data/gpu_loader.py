"""The training loader of ``cache=gpu``: batches augmented on the GPU from the image store.

It yields what the CPU loader yields (:func:`falconet.data.loader.collate`'s keys), from the
same sampler (:class:`~falconet.data.sampler.EpochBatchSampler`: the same batches, epochs,
shares of a distributed run, and mid-epoch resume), with the images already on the device:
``[B, 3, S, S]`` uint8, channels_last. Per batch:

* a host thread draws the batch's plan (:mod:`falconet.data.plans`: the draws, the boxes
  through the warp, the lookup tables, for the whole batch in numpy) and pads the targets,
  a few batches ahead of the loop, into pinned memory; it touches no CUDA stream (a copy it
  enqueued could meet a graph capture on the loop's thread);
* the loop's thread copies the plans to the device (pinned, asynchronous) and renders the
  images there (:func:`falconet.data.gpu_augment.render`): a few kernels, no host sync, on a
  stream of the loader's, one batch ahead of the batch it hands over, so that the rendering
  runs beside the training step on the GPU (the step's stream waits for it by an event).

The boxes stay a host computation on purpose: a batch's padded target shapes (its bucket) are
read on the host anyway, to pick a recording, and the numbers are then the CPU path's exactly.

The images come from the decoded store of ``cache=gpu`` (an :class:`ImageStore`) or, for
``cache=encoded`` and ``cache=stream``, from a :class:`~falconet.data.gpu_decode.DecodedRing`:
then the host thread also draws the mosaic partners from the ring's pool and starts reading the
files the batch needs, and a decoding thread decodes them into the ring (nvJPEG, on a stream of
its own) up to :data:`~falconet.data.gpu_decode.DECODE_AHEAD` batches ahead of the rendering.
torchvision's nvJPEG call returns only once its decode is done, so on the loop's thread it
would hold back the launch of the next step (GPU busy 0.886 against the step's 0.966 at batch
64, docs/lab/2026-12-07-data-at-scale.md); on a thread of its own the wait overlaps the step.
A batch's render waits for its decode by an event, and a decode waits on the device for the
render of the batch :data:`DECODE_AHEAD` before it (the slots it writes are not read by the
batches between).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from itertools import islice
from typing import Any

import torch

from falconet.data.gpu_augment import ImageStore, PlanTensors, pinned, render
from falconet.data.gpu_decode import DECODE_AHEAD, DecodedRing, Fetched
from falconet.data.loader import DetectionDataset, batch_meta, padded_targets
from falconet.data.named_threads import NamedThreads
from falconet.data.sampler import EpochBatchSampler, EpochSampler

log = logging.getLogger("falconet.data")

PLANS_AHEAD = 3  # batches whose plans the host thread has drawn or is drawing


class GpuLoader:
    """Training batches of ``dataset`` rendered from ``store`` on its device (module
    docstring). ``dataset`` holds the samples (those in the store, in its order), the image
    size, the augmentation, the seed and ``close_mosaic``; its own pixels are never read. In a
    distributed run each rank's loader holds its own shard (``falconet.training.loaders.
    gpu_shard``) and draws with a seed of its own, so the loader itself is never sharded."""

    def __init__(
        self,
        dataset: DetectionDataset,
        images: ImageStore | DecodedRing,
        batch: int,
        *,
        seed: int = 0,
    ) -> None:
        if dataset.augment is None:
            raise ValueError("GpuLoader trains: its dataset needs an augmentation")
        ring = images if isinstance(images, DecodedRing) else None
        count = len(ring.samples) if ring is not None else len(images.shapes)
        if count != len(dataset):
            raise ValueError(f"the store holds {count} images, the dataset {len(dataset)}")
        self.dataset = dataset
        self.ring = ring
        self.store = images.store if ring is not None else images
        if ring is not None:
            ring.dataset = dataset  # an image lost is drawn grey, its boxes left out
        self.device = self.store.pixels.device
        sampler = EpochSampler(len(dataset), shuffle=True, seed=seed)
        self.batch_sampler = EpochBatchSampler(sampler, batch)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def host_part(
        self, keys: list[tuple[int, int]]
    ) -> tuple[PlanTensors, dict[str, Any], Fetched | None]:
        """The plan and the padded targets of one batch of ``(epoch, index)`` keys, on the
        host (pinned when the store is on a GPU), and with a ring the files it decodes."""
        indices = [index for _, index in keys]
        epoch = keys[0][0]  # a batch never mixes epochs
        fetched = None
        if self.ring is None:
            plan = self.dataset.plan(epoch, indices)
        else:  # a batch is a run of the epoch's order, so its first key gives its position
            order, where = self.ring.order(epoch, self.batch_sampler.sampler.share)
            pool = self.ring.pool(order, int(where[indices[0]]), len(indices))
            plan, fetched = self.ring.prepare(epoch, where, self.dataset.plan(epoch, indices, pool))
        targets = {
            **padded_targets(
                torch.from_numpy(plan.boxes),
                torch.from_numpy(plan.labels),
                torch.from_numpy(plan.counts),
            ),
            **batch_meta(
                [self.dataset.samples[i] for i in indices],
                self.dataset.imgsz,
                torch.from_numpy(plan.mosaic),
            ),
        }
        pin = self.device.type == "cuda"
        if pin:
            targets = {k: pinned(v) for k, v in targets.items()}
        return PlanTensors.from_plan(plan, pin=pin), targets, fetched

    def decode_part(
        self,
        host: tuple[PlanTensors, dict[str, Any], Fetched | None],
        stream: torch.cuda.Stream | None = None,
        after: torch.cuda.Event | None = None,
    ) -> tuple[PlanTensors, dict[str, Any], ImageStore, torch.cuda.Event | None]:
        """On the decoding thread (ring) or the loop's: the batch's files (``host_part``'s)
        decoded into the ring on ``stream`` once the render recorded by ``after`` is done on
        the device; the plan, the targets, the store to render from, and the event the render
        waits for."""
        plan, targets, fetched = host
        if fetched is None:
            return plan, targets, self.store, None
        if stream is None:
            return plan, targets, self.ring.decode(fetched), None
        with torch.cuda.stream(stream):
            if after is not None:
                stream.wait_event(after)
            store = self.ring.decode(fetched)
            return plan, targets, store, stream.record_event()

    def device_part(
        self,
        plan: PlanTensors,
        targets: dict[str, Any],
        store: ImageStore,
        decoded: torch.cuda.Event | None = None,
    ) -> dict[str, Any]:
        """The batch with its images rendered from ``store`` on the device (on the current
        stream, after ``decoded``)."""
        if decoded is not None:
            torch.cuda.current_stream(self.device).wait_event(decoded)
        plan = plan.to(self.device)
        return {"images": render(store, plan, self.dataset.imgsz), **targets}

    def batch(self, keys: list[tuple[int, int]]) -> dict[str, Any]:
        """One batch of ``(epoch, index)`` keys, every part on this thread (tests, tools)."""
        return self.device_part(*self.decode_part(self.host_part(keys)))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        keys = iter(self.batch_sampler)
        # on a GPU, each batch is rendered on a stream of its own one batch ahead, before the
        # previous batch is handed over: its kernels run beside that batch's training step
        # instead of in line with it
        cuda = self.device.type == "cuda"
        side = torch.cuda.Stream(self.device) if cuda else None
        stream = torch.cuda.Stream(self.device) if cuda and self.ring is not None else None
        ahead = DECODE_AHEAD if self.ring is not None else 0
        with (
            NamedThreads(1, "falconet-plans") as plans,
            NamedThreads(1, "falconet-decode") as decoder,
        ):
            # the host thread works PLANS_AHEAD batches ahead of the decoding: a plan that
            # took longer (the GIL held by the loop or a checkpoint's writer) is absorbed
            # instead of waited for
            planned = deque(plans.submit(self.host_part, k) for k in islice(keys, PLANS_AHEAD))
            decoding: deque[Future] = deque()

            def decode_next(after: torch.cuda.Event | None) -> None:
                if not planned:
                    return
                host = planned.popleft()
                following = next(keys, None)
                if following is not None:
                    planned.append(plans.submit(self.host_part, following))
                if self.ring is None:  # nothing to decode: the loop's thread takes the plan
                    decoding.append(host)
                else:
                    decoding.append(
                        decoder.submit(lambda: self.decode_part(host.result(), stream, after))
                    )

            for _ in range(ahead + 1):
                decode_next(None)
            rendered: tuple[dict[str, Any], torch.cuda.Event | None] | None = None
            while decoding:
                parts = decoding.popleft().result()
                if self.ring is None:
                    parts = self.decode_part(parts)
                if side is None:
                    batch, done = self.device_part(*parts), None
                else:
                    with torch.cuda.stream(side):
                        batch, done = self.device_part(*parts), side.record_event()
                # the batch decoded next writes slots no pool of the batches between draws
                # from, and waits on the device for this render
                decode_next(done)
                if rendered is not None:
                    yield handed_over(*rendered)
                rendered = batch, done
            if rendered is not None:
                yield handed_over(*rendered)
        if self.ring is not None and self.ring.refused:
            log.info("data: %d file(s) nvJPEG refused were decoded on the CPU", self.ring.refused)


def handed_over(batch: dict[str, Any], rendered: torch.cuda.Event | None) -> dict[str, Any]:
    """``batch`` for the current stream: it waits for the rendering stream's ``rendered``, and
    the images' memory is not reused before the current stream's work on them is done."""
    if rendered is not None:
        stream = torch.cuda.current_stream(batch["images"].device)
        stream.wait_event(rendered)
        batch["images"].record_stream(stream)
    return batch
