"""From checked samples to padded batches: the dataset, the collate, the loader over
:mod:`falconet.data.sampler`'s resumable sampler.

Determinism: every random choice for a sample (mosaic partners, affine, colour, flip) comes from
``numpy.random.default_rng([seed, epoch, index])``, so the same seed gives the same batches
whatever the number of workers or ranks. The sampler yields ``(epoch, index)`` pairs, so the
epoch (and with it ``close_mosaic``) reaches persistent workers, which never see
``set_epoch`` calls made in the main process.

Data loading never draws from the global torch generator: a :class:`DataLoader` without a
``generator`` draws its iterator's base seed (the workers' seeds) from it at every
``iter(loader)``, and a resumed run makes one such call more after restoring the saved RNG
states than the uninterrupted run made at that point, so the states saved at its end differed.
:class:`EpochLoader` holds its own generator and seeds it at each ``iter`` from the run's seed
and the first epoch of the span it starts (:func:`worker_base_seed`).
"""

from __future__ import annotations

import hashlib
import logging
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from falconet.data.plans import AugmentPlan, BatchPlan, Planner
from falconet.data.records import Sample
from falconet.data.sampler import EpochBatchSampler, EpochSampler
from falconet.data.targets import box_rows
from falconet.data.transforms import (
    PAD_VALUE,
    AugmentConfig,
    apply_hsv,
    letterbox,
    next_bucket,
    read_image,
    resize_long_side,
    warp_mosaic,
)
from falconet.paths import cache_dir

log = logging.getLogger("falconet.data")

CACHE_MODES = ("none", "ram", "disk")

GREY = (PAD_VALUE, PAD_VALUE, PAD_VALUE)


class DetectionDataset(torch.utils.data.Dataset):
    """Samples as network inputs: ``imgsz x imgsz`` uint8 images and pixel boxes.

    :param augment: training augmentation, or ``None`` for validation (letterbox only).
    :param cache: ``none`` (decode every time), ``ram`` (decoded, resized to the long side
        ``imgsz``, held in memory; filled before workers start, shared with them) or ``disk``
        (the same arrays as ``.npy`` files in the cache folder, never beside the data).
    :param close_mosaic_from: the first epoch without mosaic (``None``: mosaic throughout).
    """

    def __init__(
        self,
        samples: Sequence[Sample],
        imgsz: int,
        *,
        augment: AugmentConfig | None = None,
        cache: str = "none",
        seed: int = 0,
        close_mosaic_from: int | None = None,
        cache_threads: int = 8,
    ) -> None:
        if cache not in CACHE_MODES:
            raise ValueError(f"cache={cache}: expected one of {', '.join(CACHE_MODES)}")
        self.samples = list(samples)
        self.imgsz = imgsz
        self.augment = augment
        self.seed = seed
        self.close_mosaic_from = close_mosaic_from
        self.cache = cache
        self._ram: list[np.ndarray] | None = None
        self._disk: Path | None = None
        self._planner: Planner | None = None  # made at the first plan, in the worker using it
        self._lost: set[int] = set()  # images whose files stopped decoding after the check
        if cache == "disk":
            self._disk = cache_dir("images", f"{imgsz}")
        if cache in ("ram", "disk"):
            with ThreadPoolExecutor(cache_threads) as pool:
                images = list(pool.map(self._fill, range(len(self.samples))))
            self._ram = images if cache == "ram" else None

    def __len__(self) -> int:
        return len(self.samples)

    def _disk_path(self, index: int) -> Path:
        path = self.samples[index].image
        stat = path.stat()
        key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{self.imgsz}"
        return self._disk / f"{hashlib.sha1(key.encode()).hexdigest()}.npy"

    def _fill(self, index: int) -> np.ndarray:
        try:
            return self._decoded(index)
        except (OSError, ValueError) as exc:
            return self.grey_for_lost(index, exc)

    def _source(self, index: int) -> np.ndarray:
        """Image ``index`` decoded from its file and resized to long side ``imgsz``."""
        return resize_long_side(read_image(str(self.samples[index].image)), self.imgsz)

    def _decoded(self, index: int) -> np.ndarray:
        if self._disk is not None:
            target = self._disk_path(index)
            if target.exists():
                return np.load(target)
            image = self._source(index)
            tmp = target.with_suffix(".tmp.npy")
            np.save(tmp, image)
            tmp.replace(target)
            return image
        return self._source(index)

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The image resized to long side ``imgsz`` and its boxes in those pixels."""
        if self._ram is not None:
            image = self._ram[index]
        else:
            try:  # read only: workers never write the disk cache, filled before they start
                disk = self._disk is not None
                image = np.load(self._disk_path(index)) if disk else self._source(index)
            except (OSError, ValueError) as exc:
                image = self.grey_for_lost(index, exc)
        h, w = image.shape[:2]
        boxes = self.samples[index].boxes * np.array([w, h, w, h], np.float32)
        if index in self._lost:
            boxes = boxes[:0]
        return image, boxes

    def grey_for_lost(self, index: int, error: Exception) -> np.ndarray:
        """A grey image of the size the dataset check measured, for an image whose file no
        longer decodes (deleted, truncated or replaced while training): the run goes on with
        it empty, its boxes left out of the plans from now on, and says so once per file in
        each process that meets it."""
        if index not in self._lost:
            self._lost.add(index)
            if self._planner is not None:
                self._planner.drop_boxes(index)
            log.warning(
                "data: %s could not be read (%s) after the dataset check; it trains as an "
                "empty grey image from now on. Run `falconet data check` on the dataset",
                self.samples[index].image,
                error,
            )
        h, w = resized_shape(self.samples[index], self.imgsz)
        return np.full((h, w, 3), PAD_VALUE, np.uint8)

    def shape(self, index: int) -> tuple[int, int]:
        """``(height, width)`` of image ``index`` resized to long side ``imgsz``."""
        if self._ram is not None:
            return self._ram[index].shape[:2]
        return resized_shape(self.samples[index], self.imgsz)

    def plan(self, epoch: int, indices: Sequence[int], pool: np.ndarray | None = None) -> BatchPlan:
        """The augmentation of samples ``indices`` in ``epoch`` (:mod:`falconet.data.plans`;
        ``pool``: where mosaic partners come from, as there)."""
        if self._planner is None:
            self._planner = Planner(
                self.samples, size=self.imgsz, cfg=self.augment, seed=self.seed, shape=self.shape
            )
            for index in self._lost:
                self._planner.drop_boxes(index)
        mosaic_on = self.close_mosaic_from is None or epoch < self.close_mosaic_from
        return self._planner.plan(epoch, indices, mosaic_on=mosaic_on, pool=pool)

    def render(self, plan: AugmentPlan, loaded: dict[int, np.ndarray] | None = None) -> np.ndarray:
        """The plan's output image on the CPU (OpenCV): the canvas warped, then HSV
        (``loaded``: images already decoded, by index)."""
        loaded = loaded or {}
        images = [loaded.get(t[0], None) for t in plan.tiles]
        images = [
            self.load(t[0])[0] if im is None else im
            for t, im in zip(plan.tiles, images, strict=True)
        ]
        if plan.layout is not None:
            image = warp_mosaic(images, plan.layout, plan.matrix)
        else:
            image, _, _ = letterbox(images[0], self.imgsz)
            image = cv2.warpAffine(
                image, plan.matrix[:2], dsize=(self.imgsz, self.imgsz), borderValue=GREY
            )
        return apply_hsv(image, plan.gains)

    def __getitem__(self, key: tuple[int, int] | int) -> dict[str, Any]:
        epoch, index = key if isinstance(key, tuple) else (0, key)
        sample = self.samples[index]
        pad = (0.0, 0.0)
        if self.augment is None:
            image, boxes = self.load(index)
            image, _, pad = letterbox(image, self.imgsz)
            boxes = boxes + np.array([*pad, *pad], np.float32)
            labels, used_mosaic = sample.labels, False
        else:
            plan = self.plan(epoch, [index]).sample(0)
            lost = len(self._lost)
            image = self.render(plan)
            if len(self._lost) > lost:  # a tile's file stopped decoding: the same draws, its
                plan = self.plan(epoch, [index]).sample(0)  # boxes left out
            boxes, labels, used_mosaic = plan.boxes, plan.labels, plan.mosaic
        return {
            "image": torch.from_numpy(np.ascontiguousarray(image)),  # HWC: see collate
            **self.item(index, boxes, labels, pad, used_mosaic),
        }

    def item(
        self,
        index: int,
        boxes: np.ndarray,
        labels: np.ndarray,
        pad: tuple[float, float] = (0.0, 0.0),
        mosaic: bool = False,
    ) -> dict[str, Any]:
        """A sample's entry for :func:`collate_targets`: its boxes and what maps them back."""
        sample = self.samples[index]
        # a sample no augmentation touched keeps the label snapshot's read-only arrays: copy
        # those (torch warns of, and must not share, memory it cannot write)
        boxes = np.require(np.asarray(boxes, np.float32).reshape(-1, 4), requirements="CW")
        return {
            "boxes": torch.from_numpy(boxes),
            "labels": torch.from_numpy(np.require(labels, np.int64, requirements="CW")),
            "image_id": sample.image_id,
            "orig_size": (sample.height, sample.width),
            "ratio": self.imgsz / max(sample.width, sample.height),
            "pad": pad,
            "mosaic": mosaic,
        }


def batch_meta(
    samples: Sequence[Sample], imgsz: int, mosaic: torch.Tensor
) -> dict[str, torch.Tensor]:
    """What :func:`collate_targets` makes beside the boxes for augmented ``samples`` (no
    letterbox pad: the warp places them), in one go."""
    return {
        "image_ids": torch.tensor([s.image_id for s in samples], dtype=torch.int64),
        "orig_sizes": torch.tensor([(s.height, s.width) for s in samples], dtype=torch.int64),
        "ratios": torch.tensor(
            [imgsz / max(s.width, s.height) for s in samples], dtype=torch.float64
        ),
        "pads": torch.zeros(len(samples), 2, dtype=torch.float64),
        "mosaic": mosaic,
    }


def resized_shape(sample: Sample, size: int) -> tuple[int, int]:
    """``(height, width)`` of ``sample`` resized to long side ``size``, as
    :func:`~falconet.data.transforms.resize_long_side` makes it."""
    h, w = sample.height, sample.width
    ratio = size / max(h, w)
    if ratio == 1:
        return h, w
    return max(1, round(h * ratio)), max(1, round(w * ratio))


def collate(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack images; pad targets to ``[B, M, ...]`` with ``M`` a bucket (power of two >= 8) of
    the largest box count, plus ``counts [B]``. Padded rows are zeros; ``counts`` says how many
    rows are real, so model, assigner and loss code stays static-shaped per bucket. The same
    boxes per box, ``box_images``/``box_slots`` (:mod:`falconet.data.targets`), come along.

    ``images`` is ``[B, 3, S, S]`` uint8 in channels_last memory (a view of the stacked HWC
    arrays): no transpose on the CPU, and the layout the GPU's convolutions want.
    """
    images = torch.stack([item["image"] for item in items]).permute(0, 3, 1, 2)
    return {"images": images, **collate_targets(items)}


def collate_targets(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Everything :func:`collate` makes but the images."""
    counts = torch.tensor([len(item["labels"]) for item in items], dtype=torch.int64)
    return {
        **padded_targets(
            torch.cat([item["boxes"] for item in items]) if items else torch.zeros(0, 4),
            torch.cat([item["labels"] for item in items]) if items else torch.zeros(0),
            counts,
        ),
        "image_ids": torch.tensor([item["image_id"] for item in items], dtype=torch.int64),
        "orig_sizes": torch.tensor([item["orig_size"] for item in items], dtype=torch.int64),
        "ratios": torch.tensor([item["ratio"] for item in items], dtype=torch.float64),
        "pads": torch.tensor([item["pad"] for item in items], dtype=torch.float64),
        "mosaic": torch.tensor([item["mosaic"] for item in items]),
    }


def padded_targets(
    boxes: torch.Tensor, labels: torch.Tensor, counts: torch.Tensor
) -> dict[str, torch.Tensor]:
    """A batch's boxes ``[n, 4]`` and labels ``[n]`` (image after image, ``counts [B]`` each)
    as :func:`collate`'s padded ``boxes``/``labels`` and their rows (numpy underneath, as
    :func:`~falconet.data.targets.box_rows` says why)."""
    bucket = next_bucket(int(counts.max()) if len(counts) else 0)
    box_images, box_slots = box_rows(counts)
    rows = box_images[: len(boxes)].numpy(), box_slots[: len(boxes)].numpy()
    padded_boxes = np.zeros((len(counts), bucket, 4), np.float32)
    padded_labels = np.zeros((len(counts), bucket), np.int64)
    padded_boxes[rows] = np.asarray(boxes, np.float32)
    padded_labels[rows] = np.asarray(labels, np.int64)
    return {
        "boxes": torch.from_numpy(padded_boxes),
        "labels": torch.from_numpy(padded_labels),
        "counts": torch.as_tensor(counts, dtype=torch.int64),
        "box_images": box_images,
        "box_slots": box_slots,
    }


def worker_base_seed(seed: int, epoch: int) -> int:
    """The seed of a loader's own generator when an iterator starts at ``epoch``.

    Worker ``i`` of that iterator has torch's and Python's global seed ``base + i`` (and a
    NumPy seed derived from both), where ``base`` is the generator's first draw: the workers
    differ from each other, the seed changes with the epoch, and a resumed run starting at
    ``epoch`` draws its workers' seeds from the same state as any other run of that seed
    starting there. falconet's own augmentation does not read them (it draws from
    ``(seed, epoch, index)``); they are for a dataset or transform that uses a global RNG.
    """
    words = np.random.SeedSequence([seed, epoch, 0x6C6F6164]).generate_state(2, np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])  # below 2**63: a valid manual_seed


class EpochLoader(torch.utils.data.DataLoader):
    """A :class:`~torch.utils.data.DataLoader` over an :class:`EpochBatchSampler` whose
    workers' seeds come from its own generator, never from the global torch generator.

    Each ``iter`` seeds ``self.generator`` with :func:`worker_base_seed` of ``seed`` and the
    batch sampler's first epoch before torch draws the iterator's base seed from it, so the
    draw depends on where the span starts, not on how many iterators came before (a run that
    restores the global RNG states on resume reproduces them exactly at its end). Persistent
    workers keep the seeds of the iterator that started them.
    """

    def __init__(self, *args: Any, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, generator=torch.Generator(), **kwargs)
        self.seed = seed

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self.generator.manual_seed(worker_base_seed(self.seed, self.batch_sampler.first))
        return super().__iter__()


def _worker_init(_worker_id: int) -> None:
    import cv2

    cv2.setNumThreads(0)  # workers are the parallelism; OpenCV's own threads would oversubscribe


def worker_start_method() -> str | None:
    """How the loaders' workers start: forked on Linux, the platform's default elsewhere.

    A forked worker shares the parent's memory copy-on-write (the ``cache=ram`` images, the
    objects frozen for the collector) and starts without importing anything. Python 3.14
    made ``forkserver`` the default on Linux, and PyTorch's ``DataLoader`` follows the
    default: each worker would then import torch, OpenCV and falconet, and receive the dataset
    pickled, its RAM cache copied once per worker. Fork's hazard is a lock another thread
    holds at the fork, held for ever in the child; a worker runs only the dataset, OpenCV on
    one thread and the collate, never CUDA, and the start-up's threads are joined before the
    loaders fork (:mod:`falconet.training.first_use`). macOS (where Apple's libraries are not
    fork-safe) and Windows keep their default, ``spawn``.
    """
    return "fork" if sys.platform.startswith("linux") else None


def stop_workers(loader: torch.utils.data.DataLoader) -> None:
    """Stop a loader's persistent workers now, while the run can still wait for them.

    Left alone, they stop when their iterator is collected or at the interpreter's exit, and
    both were seen to wait out a timeout per worker: PyTorch 2.11 (the GPU machine's) joins
    each pinned-memory worker at exit with a timeout before telling it to stop
    (pytorch/pytorch#81794), and once a garbage collection of a dropped trainer waited as long
    inside the iterator's own shutdown (cause not found). The wait grows with the workers and
    comes after the last epoch (``tools/bench_startup.py`` measures it; the record is in
    docs/lab/2026-11-end-to-end-and-accuracy.md, "A short run from start to exit"). Stopped
    here, while the run still holds the loader, they exit at once; the loader stays usable
    (its next ``iter`` starts new workers).
    """
    iterator = getattr(loader, "_iterator", None)  # where DataLoader keeps persistent workers
    if iterator is None:
        return
    loader._iterator = None
    shutdown = getattr(iterator, "_shutdown_workers", None)  # absent without workers
    if shutdown is not None:
        shutdown()


def build_loader(
    dataset: DetectionDataset,
    batch: int,
    *,
    workers: int = 0,
    shuffle: bool = True,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    pin_memory: bool | None = None,
) -> torch.utils.data.DataLoader:
    """An :class:`EpochLoader` over ``dataset`` whose batches come from an
    :class:`EpochBatchSampler` (``loader.batch_sampler``; one epoch unless ``set_epochs``
    spans more).

    Workers are persistent (no re-fork per epoch; :func:`stop_workers` ends them) and forked
    where the platform allows (:func:`worker_start_method`); pinned memory when CUDA is
    present. Iterating draws nothing from the global torch generator.
    """
    sampler = EpochSampler(
        len(dataset), shuffle=shuffle, seed=seed, rank=rank, world_size=world_size
    )
    return EpochLoader(
        dataset,
        seed=seed,
        batch_sampler=EpochBatchSampler(sampler, batch),
        num_workers=workers,
        collate_fn=collate,
        persistent_workers=workers > 0,
        multiprocessing_context=worker_start_method() if workers else None,
        worker_init_fn=_worker_init if workers else None,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        prefetch_factor=4 if workers else None,
    )
