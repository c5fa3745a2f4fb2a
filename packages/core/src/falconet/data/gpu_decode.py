"""``cache=encoded`` and ``cache=stream``: each batch's images decoded on the GPU from their
files' bytes (:mod:`falconet.data.encoded_store`) into a ring of decoded slots, which the
batch render reads as it reads the decoded store of ``cache=gpu``.

**The ring.** ``slots`` images decoded at long side ``imgsz`` in ``imgsz x imgsz x 3`` slots:
a pool of :data:`MOSAIC_POOL` (at least four batches) and :data:`DECODE_AHEAD` batches more.
The image at position ``p`` of an epoch's order is decoded into slot ``(epoch * n + p) mod
slots`` (``n`` images an epoch: the positions run on across epochs) when its batch comes, so
every image is decoded once an epoch, not four times (a mosaic shows four images). A mosaic's
three partners are drawn from the pool: the ``pool`` positions of the epoch's order up to the
batch's last, as Ultralytics draws them from its buffer of recently loaded images. The pool is
a function of the epoch's order and the batch's position, so the draws are the same whatever
resumes (a resumed run decodes the partners its first batch needs). The planning thread keeps
which ``(epoch, index)`` each slot will hold once the batches planned so far are decoded; a
batch decodes only what its plan needs and the ring does not hold.

**Decoding ahead.** The loader decodes on a thread and a stream of its own
(:class:`~falconet.data.gpu_loader.GpuLoader`), up to :data:`DECODE_AHEAD` batches ahead of the
batch it renders, so the training loop's thread never waits for a decode. The slots beyond the
pool are what makes that safe: a batch decoded ``DECODE_AHEAD`` ahead writes only slots that no
pool of the batches between is drawn from, and it waits on the device for the render of the
batch before those.

**Decoders.** nvJPEG decodes the JPEG files stored upright (``torchvision.io.decode_jpeg`` on
the device, the batch in one call; on A100, H100 and H200 torchvision takes the hardware JPEG
decoder for baseline files). The CPU decoder (OpenCV, as the CPU loader) takes every other file
(PNG, BMP, ..., a JPEG stored turned: :attr:`Sample.exif_oriented`) on the reader threads, and
any file nvJPEG refuses or decodes to another size than the dataset check measured (a PNG named
``.jpg``, CMYK): the first such file is logged, the files counted (:attr:`DecodedRing.refused`),
and each goes to the CPU from then on. A file neither decodes (changed since the check) is
drawn grey with its boxes left out from then on, one warning per file, as the CPU loader does.
Without a CUDA device or torchvision every file goes to the CPU decoder.

**Sharing the decode with the CPU.** Beside a training step that keeps the GPU full, nvJPEG's
call slows down several times over against the loader alone (measured at batch 64:
docs/lab/2026-12-07-data-at-scale.md), while
the process keeps only about one of the machine's cores busy. So a share ``cpu_share`` of the
files nvJPEG would take (``cpu_decode=`` in a run) goes to the reader threads' CPU decoder
instead, decoded and resized beside the nvJPEG call and copied up from pinned memory. Which
files: a fixed draw per image (:func:`cpu_share_mask`), the same every epoch and every run of
the dataset, so the share changes no batch from one run to the next.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from falconet.data.encoded_store import EncodedFiles
from falconet.data.gpu_augment import ImageStore
from falconet.data.gpu_cache import for_nvjpeg, gpu_decoder, place
from falconet.data.loader import resized_shape
from falconet.data.named_threads import NamedThreads
from falconet.data.plans import BatchPlan
from falconet.data.records import Sample
from falconet.data.transforms import PAD_VALUE, read_image, resize_long_side

if TYPE_CHECKING:
    from falconet.data.loader import DetectionDataset

log = logging.getLogger("falconet.data")

MOSAIC_POOL = 1024
"""The images mosaic partners are drawn from, the last decoded (module docstring); a pool
holds at least four batches."""

DECODE_AHEAD = 2
"""Batches the decoding may run ahead of the batch being rendered (module docstring)."""

READERS = 8
"""Threads that read (``cache=stream``) and CPU-decode a batch's files."""

CPU_SHARE_SEED = 0x6370755F
"""Seed of the fixed draw that picks the files the CPU decodes (:func:`cpu_share_mask`)."""

JpegDecoder = Callable[[list[torch.Tensor]], list[torch.Tensor]]
"""``[n]`` uint8 host tensors of JPEG bytes -> ``[3, H, W]`` uint8 RGB images on the device;
raises ``RuntimeError`` where it refuses one of them."""


def ring_pool(batch: int, count: int, pool: int = MOSAIC_POOL) -> int:
    """The partner pool for batches of ``batch`` over ``count`` images: :data:`MOSAIC_POOL`,
    at least four batches, at most the images there are, never less than a batch."""
    return max(min(max(pool, 4 * batch), count), batch, 1)


def ring_slots(batch: int, count: int, pool: int = MOSAIC_POOL) -> int:
    """The ring's slots: the pool and :data:`DECODE_AHEAD` batches."""
    return ring_pool(batch, count, pool) + DECODE_AHEAD * batch


def ring_bytes(slots: int, size: int) -> int:
    """Device bytes of a ring of ``slots`` at long side ``size``."""
    return slots * size * size * 3


@dataclass
class Fetched:
    """A batch's images to decode, read on the planning thread's readers: ``(index, slot)``
    for nvJPEG with their bytes being read in :data:`READERS` chunks (a task per file cost
    more in thread hand-offs than the read of a held file), and ``(index, slot, image or
    error)`` decoded on the CPU."""

    jpegs: list[tuple[int, int]] = field(default_factory=list)
    reads: list[Future] = field(default_factory=list)
    decoded: list[tuple[int, int, Future]] = field(default_factory=list)

    def jpeg_bytes(self) -> list[np.ndarray | OSError]:
        """The bytes of each of :attr:`jpegs`, in order (the error where a read failed)."""
        return [data for read in self.reads for data in read.result()]


class DecodedRing:
    """The ring of a decoding loader (module docstring) over ``samples`` (the dataset's, in its
    order) and their ``files``, on ``device``: partners drawn from the last ``pool`` images,
    batches of ``batch`` decoded up to :data:`DECODE_AHEAD` ahead."""

    def __init__(
        self,
        samples: list[Sample],
        files: EncodedFiles,
        size: int,
        device: torch.device,
        pool: int,
        batch: int,
        *,
        decode_jpegs: JpegDecoder | None = None,
        cpu_share: float = 0.0,
    ) -> None:
        if len(files) != len(samples):
            raise ValueError(f"{len(files)} files for {len(samples)} samples")
        if pool < batch:
            raise ValueError(f"a pool of {pool} images for batches of {batch}: at least a batch")
        if not 0.0 <= cpu_share <= 1.0:
            raise ValueError(f"cpu_share={cpu_share}: a share of the files, from 0 to 1")
        self.samples, self.files, self.size, self.device = samples, files, size, device
        self.pool_size, self.batch = pool, batch
        slots = self.slots = pool + DECODE_AHEAD * batch
        self.pixels = torch.zeros(slots, size, size, 3, dtype=torch.uint8, device=device)
        self.shapes = [resized_shape(s, size) for s in samples]
        self.store = ImageStore(self.pixels, [(0, 0)] * slots)
        self._decode = decode_jpegs or nvjpeg_decoder(device)
        self.on_cpu = np.ones(len(samples), bool)
        if self._decode is not None:
            self.on_cpu[for_nvjpeg(samples)] = False
            self.on_cpu |= cpu_share_mask(len(samples), cpu_share)
        self.cpu_share = cpu_share
        self.refused = 0
        self.held = np.full((slots, 2), -1, np.int64)  # (epoch, index): the planning thread's
        self._orders: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._readers = NamedThreads(READERS, "falconet-read")
        self.dataset: DetectionDataset | None = None  # the loader's, for images lost

    @property
    def decoder(self) -> str:
        return "nvJPEG" if self._decode is not None else "the CPU"

    def order(self, epoch: int, share: Callable[[int], list[int]]) -> tuple[np.ndarray, ...]:
        """The epoch's order (``share(epoch)``) and each index's position in it."""
        if epoch not in self._orders:
            self._orders = {k: v for k, v in self._orders.items() if k >= epoch - 1}
            order = np.asarray(share(epoch), np.int64)
            where = np.full(len(self.samples), -1, np.int64)
            where[order] = np.arange(len(order))
            self._orders[epoch] = (order, where)
        return self._orders[epoch]

    def pool(self, order: np.ndarray, position: int, batch: int) -> np.ndarray:
        """The partners' pool of the batch at ``position``: the last images of the epoch's
        order decoded with it."""
        return order[max(0, position + batch - self.pool_size) : position + batch]

    def prepare(self, epoch: int, where: np.ndarray, plan: BatchPlan) -> tuple[BatchPlan, Fetched]:
        """On the planning thread: ``plan`` with its tiles' images as ring slots, and the
        images to decode for it, being read."""
        images = plan.tiles[:, :, 0]
        present = images >= 0
        offset = epoch * len(where)  # the positions run on across epochs (module docstring)
        at = where[np.where(present, images, 0)] + offset
        slot_of = np.where(present, at % self.slots, -1)
        fetched = Fetched()
        pairs = zip(images[present].tolist(), slot_of[present].tolist(), strict=True)
        for index, slot in dict.fromkeys(pairs):
            if tuple(self.held[slot]) == (epoch, index):
                continue
            self.held[slot] = epoch, index
            if self.on_cpu[index]:
                fetched.decoded.append((index, slot, self._readers.submit(self._on_cpu, index)))
            else:
                fetched.jpegs.append((index, slot))
        chunk = -(-len(fetched.jpegs) // READERS)
        for start in range(0, len(fetched.jpegs), chunk or 1):
            indices = [index for index, _ in fetched.jpegs[start : start + chunk]]
            fetched.reads.append(self._readers.submit(self._read_all, indices))
        tiles = plan.tiles.copy()
        tiles[:, :, 0] = slot_of
        return replace(plan, tiles=tiles), fetched

    def _read_all(self, indices: list[int]) -> list[np.ndarray | OSError]:
        out: list[np.ndarray | OSError] = []
        for index in indices:
            try:
                out.append(self.files.read(index))
            except OSError as exc:
                out.append(exc)
        return out

    def _on_cpu(self, index: int) -> torch.Tensor | OSError:
        """Image ``index`` decoded and resized on the CPU, ``[H, W, 3]`` uint8; in pinned
        memory when the ring is on a GPU, so its copy up does not hold the decoding thread."""
        try:
            image = resize_long_side(read_image(str(self.samples[index].image)), self.size)
        except OSError as exc:
            return exc
        image = torch.from_numpy(image)
        return image.pin_memory() if self.device.type == "cuda" else image

    def decode(self, fetched: Fetched) -> ImageStore:
        """On the decoding thread, on its stream: the fetched images decoded into their slots;
        the ring as a store for the render."""
        jpegs = []
        for (index, slot), data in zip(fetched.jpegs, fetched.jpeg_bytes(), strict=True):
            if isinstance(data, OSError):
                self._lost(index, slot, data)
            else:
                jpegs.append((index, slot, torch.from_numpy(data)))
        if jpegs:
            images = self._decode_all([data for _, _, data in jpegs])
            for (index, slot, _), image in zip(jpegs, images, strict=True):
                if image is None or tuple(image.shape[1:]) != self._checked(index):
                    self._refused(index, image)
                    image = self._on_cpu(index)
                    if isinstance(image, OSError):
                        self._lost(index, slot, image)
                        continue
                    image = self._up(image)
                place(self.pixels, slot, image, self.shapes[index])
        for index, slot, done in fetched.decoded:
            image = done.result()
            if isinstance(image, OSError):
                self._lost(index, slot, image)
                continue
            place(self.pixels, slot, self._up(image), self.shapes[index])
        return self.store

    def _up(self, image: torch.Tensor) -> torch.Tensor:
        """A CPU-decoded ``[H, W, 3]`` image on the ring's device as ``[3, H, W]``
        (asynchronous from pinned memory: torch's pinned allocator keeps the block until the
        copy is done)."""
        return image.to(self.device, non_blocking=True).permute(2, 0, 1)

    def _checked(self, index: int) -> tuple[int, int]:
        return self.samples[index].height, self.samples[index].width

    def _decode_all(self, data: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """The batch in one call; where it is refused, file by file (``None``: refused)."""
        try:
            return list(self._decode(data))
        except RuntimeError:
            out: list[torch.Tensor | None] = []
            for one in data:
                try:
                    out.append(self._decode([one])[0])
                except RuntimeError:
                    out.append(None)
            return out

    def _refused(self, index: int, image: torch.Tensor | None) -> None:
        if self.on_cpu[index]:  # planned for nvJPEG before its first refusal was seen
            return
        self.on_cpu[index] = True
        self.refused += 1
        if self.refused == 1:
            got = "refused it" if image is None else f"decoded it as {tuple(image.shape[1:])}"
            log.warning(
                "data: nvJPEG %s (%s; the dataset check measured %s); it and any other file "
                "nvJPEG refuses are decoded on the CPU from now on, counted",
                got,
                self.samples[index].image,
                self._checked(index),
            )

    def _lost(self, index: int, slot: int, error: Exception) -> None:
        """An image neither decoder reads now: grey, its boxes left out from now on."""
        h, w = self.shapes[index]
        if self.dataset is not None:
            self.dataset.grey_for_lost(index, error)
        self.pixels[slot, :h, :w] = PAD_VALUE

    def close(self) -> None:
        self._readers.shutdown(wait=False, cancel_futures=True)
        self.files.close()


def auto_cpu_share(cores: int) -> float:
    """``cpu_decode=auto``: the share of the JPEG files decoded on the CPU for a rank that may
    use ``cores`` (its share of the node's): none up to four cores (the loop, the planning and
    the decoding threads need theirs), then a sixteenth a core more, at most three quarters
    (16 cores: the share that kept 8 readers busy at batch 64 on an H100, data.md)."""
    return min(0.75, max(0.0, (cores - 4) / 16))


def cpu_share_mask(count: int, share: float) -> np.ndarray:
    """``[count]`` bool: the images the CPU decodes for a ``share`` of them (module docstring),
    a fixed draw of :data:`CPU_SHARE_SEED`, so the same images every epoch and every run; the
    images of a smaller share are among those of a larger one."""
    return np.random.default_rng(CPU_SHARE_SEED).random(count) < share


def nvjpeg_decoder(device: torch.device) -> JpegDecoder | None:
    """nvJPEG through torchvision on a CUDA ``device``; ``None`` off CUDA or without
    torchvision (then the CPU decodes). Before each call the host waits for the current
    stream's work (the decoding thread's own stream, so the wait holds up only that thread):
    torchvision allocates its outputs on the caller's stream and writes them on a stream of its
    own, so a block freed by work still queued there could be written early
    (:func:`falconet.data.gpu_cache.fill_store` does the same)."""
    if device.type != "cuda" or gpu_decoder() is None:
        return None
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(data: list[torch.Tensor]) -> list[torch.Tensor]:
        torch.cuda.current_stream(device).synchronize()
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)

    return decode
