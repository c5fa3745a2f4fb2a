"""The run's data loaders: the augmented training loader and the validation loader."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch

from falconet.data import gpu_render
from falconet.data.gpu_cache import STORE_SHARE, Filled, fill_store, store_bytes, store_fits
from falconet.data.gpu_loader import GpuLoader
from falconet.data.loader import DetectionDataset, build_loader
from falconet.data.records import Dataset, Sample
from falconet.data.transforms import AugmentConfig
from falconet.training.config import ConfigError, TrainConfig
from falconet.training.distributed import ONE_PROCESS, World, any_rank, per_rank_batch

log = logging.getLogger("falconet.train")


def augment_config(cfg: TrainConfig) -> AugmentConfig:
    return AugmentConfig(
        mosaic=cfg.mosaic,
        degrees=cfg.degrees,
        translate=cfg.translate,
        shear=cfg.shear,
        scale=cfg.scale,
        hsv_h=cfg.hsv_h,
        hsv_s=cfg.hsv_s,
        hsv_v=cfg.hsv_v,
        fliplr=cfg.fliplr,
    )


def worker_count(requested: int) -> int:
    return min(requested, os.cpu_count() or 1)


def train_samples(cfg: TrainConfig, dataset: Dataset) -> list[Sample]:
    """The train split's samples the run trains on (its leading ``fraction``)."""
    train = dataset.splits["train"].samples
    if cfg.fraction < 1:
        train = train[: max(1, round(len(train) * cfg.fraction))]
    return list(train)


RANK_SEED_STRIDE = 1_000_003
"""``cache=gpu``: rank ``r`` draws from seed ``seed + r x`` this (its shard's order and plans)."""


def gpu_shard(samples: list[Sample], world: World) -> list[Sample]:
    """This rank's fixed share of the training samples under ``cache=gpu``: every
    ``world.size``-th from its rank, the short shares padded by repeating theirs, so every rank
    holds as many (and trains as many batches an epoch) and together they hold every image."""
    share = samples[world.rank :: world.size] or samples[world.rank % len(samples) :][:1]
    size = -(-len(samples) // world.size)
    return (share * size)[:size]


def resolve_cache(
    cfg: TrainConfig, dataset: Dataset, device: torch.device, world: World = ONE_PROCESS
) -> str:
    """``cache=auto``'s choice, logged with its reason: ``gpu`` (decoded in GPU memory and
    augmented there, docs/data.md) on a CUDA device where this rank's images take at most
    :data:`~falconet.data.gpu_cache.STORE_SHARE` of its free memory, on every rank of a
    distributed run, else ``none`` (a RAM cache of a large set could exhaust host memory, so it
    stays a choice made by name). The ranks agree: one holding its shard while another drew
    from its share of the whole set would train some images twice an epoch and others never.
    Any other value is returned as it is."""
    if cfg.cache != "auto":
        return cfg.cache
    if device.type != "cuda":
        log.info("cache=auto: none (the GPU path needs a CUDA device; this run is on %s)", device)
        return "none"
    count = len(gpu_shard(train_samples(cfg, dataset), world))
    free, _ = torch.cuda.mem_get_info(device)
    fits_here, gib = store_fits(count, cfg.imgsz, free), 2**30
    fits = not any_rank(not fits_here, device)
    log.info(
        "cache=auto: %s (%d images at %d px take %.2f GiB; %.1f GiB free on %s, at most %.0f%% "
        "of it for the images%s)",
        "gpu" if fits else "none",
        count,
        cfg.imgsz,
        store_bytes(count, cfg.imgsz) / gib,
        free / gib,
        device,
        STORE_SHARE * 100,
        "; another rank's do not fit" if fits_here and not fits else "",
    )
    return "gpu" if fits else "none"


def host_cache(cache: str) -> str:
    """The CPU loader's cache for the run's ``cache``: ``auto`` is ``none`` where no run
    resolved it for a device (:func:`resolve_cache`), as for a loader built on its own."""
    return "none" if cache == "auto" else cache


def fill_gpu_cache(
    cfg: TrainConfig,
    dataset: Dataset,
    device: torch.device,
    world: World = ONE_PROCESS,
    memory: tuple[int, int] | None = None,
) -> Filled:
    """``cache=gpu``: this rank's training images (:func:`gpu_shard`) decoded into
    ``device``'s memory (:mod:`falconet.data.gpu_cache`; ``memory`` as there); refused off
    CUDA."""
    if device.type != "cuda":
        raise ConfigError(
            f"cache=gpu keeps the images in GPU memory and this run is on {device.type}; "
            "use cache=ram"
        )
    start = time.perf_counter()
    gpu_render.compile_in_background(device, cfg.imgsz)  # while the store fills
    samples = gpu_shard(train_samples(cfg, dataset), world)
    filled = fill_store(samples, cfg.imgsz, device, memory=memory)
    log.info(
        "cache=gpu: %d images decoded in %.1f s (%d by nvJPEG, %d on the CPU)%s",
        filled.on_gpu + filled.on_cpu,
        time.perf_counter() - start,
        filled.on_gpu,
        filled.on_cpu,
        f", rank {world.rank}'s shard of {world.size}" if world.size > 1 else "",
    )
    return filled


def build_loaders(
    cfg: TrainConfig,
    dataset: Dataset,
    device: torch.device,
    world: World = ONE_PROCESS,
    gpu_cache: Filled | None = None,
) -> tuple[Any, torch.utils.data.DataLoader | None]:
    """The training loader (augmented, resumable sampler; in a distributed run this rank's
    share of every global batch) and the validation loader (this rank's share of the split).
    With ``cache=gpu`` (``gpu_cache``, :func:`fill_gpu_cache`) the training batches are
    augmented on the GPU (:class:`~falconet.data.gpu_loader.GpuLoader`)."""
    close_from = cfg.epochs - cfg.close_mosaic if cfg.close_mosaic else None
    per_rank = per_rank_batch(cfg.batch, world)
    val_loader = build_val_loader(cfg, dataset, device, world) if cfg.val else None
    if gpu_cache is not None:
        # each rank trains on the shard it holds, in its own order and with its own draws
        rank_seed = cfg.seed + RANK_SEED_STRIDE * world.rank
        train_set = DetectionDataset(
            gpu_cache.samples,
            cfg.imgsz,
            augment=augment_config(cfg),
            seed=rank_seed,
            close_mosaic_from=close_from,
        )
        loader = GpuLoader(train_set, gpu_cache.store, per_rank, seed=rank_seed)
        return loader, val_loader
    train_set = DetectionDataset(
        train_samples(cfg, dataset),
        cfg.imgsz,
        augment=augment_config(cfg),
        cache=host_cache(cfg.cache),
        seed=cfg.seed,
        close_mosaic_from=close_from,
    )
    train_loader = build_loader(
        train_set,
        per_rank,
        workers=worker_count(cfg.workers),
        shuffle=True,
        seed=cfg.seed,
        rank=world.rank,
        world_size=world.size,
        pin_memory=device.type == "cuda",
    )
    return train_loader, val_loader


def build_val_loader(
    cfg: TrainConfig, dataset: Dataset, device: torch.device, world: World = ONE_PROCESS
) -> torch.utils.data.DataLoader:
    """Letterboxed val images in order, twice the training batch per step (per rank: each
    rank predicts every ``world.size``-th image, and rank 0 scores them all)."""
    cache = "ram" if cfg.cache == "gpu" else host_cache(cfg.cache)  # val: on the CPU workers
    val_set = DetectionDataset(dataset.splits["val"].samples, cfg.imgsz, cache=cache)
    return build_loader(
        val_set,
        per_rank_batch(cfg.batch, world) * 2,
        workers=worker_count(cfg.workers),
        shuffle=False,
        rank=world.rank,
        world_size=world.size,
        pin_memory=device.type == "cuda",
    )
