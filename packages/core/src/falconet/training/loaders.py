"""The run's data loaders: the augmented training loader and the validation loader."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from falconet.data import gpu_render
from falconet.data.encoded_store import EncodedFiles, file_sizes
from falconet.data.gpu_cache import Filled, fill_store, gpu_decoder, store_bytes
from falconet.data.gpu_decode import (
    DecodedRing,
    auto_cpu_share,
    ring_bytes,
    ring_pool,
    ring_slots,
)
from falconet.data.gpu_loader import GpuLoader
from falconet.data.loader import CACHE_MODES, DetectionDataset, build_loader
from falconet.data.records import Dataset, Sample
from falconet.data.tiers import GPU_TIERS, Footing, choose_tier, host_available
from falconet.data.transforms import AugmentConfig
from falconet.training.config import ConfigError, TrainConfig
from falconet.training.distributed import ONE_PROCESS, World, any_rank, per_rank_batch
from falconet.training.threads import thread_count, usable_cores

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
    """``requested`` workers, at most the cores this process may use."""
    return min(requested, usable_cores())


def train_samples(cfg: TrainConfig, dataset: Dataset) -> list[Sample]:
    """The train split's samples the run trains on (its leading ``fraction``)."""
    train = dataset.splits["train"].samples
    if cfg.fraction < 1:
        train = train[: max(1, round(len(train) * cfg.fraction))]
    return list(train)


RANK_SEED_STRIDE = 1_000_003
"""On the GPU path (``cache=gpu``, ``encoded``, ``stream``) rank ``r`` draws from seed
``seed + r x`` this (its shard's order and plans)."""


def gpu_shard(samples: list[Sample], world: World) -> list[Sample]:
    """This rank's fixed share of the training samples on the GPU path: every
    ``world.size``-th from its rank, the short shares padded by repeating theirs, so every rank
    holds as many (and trains as many batches an epoch) and together they hold every image."""
    share = samples[world.rank :: world.size] or samples[world.rank % len(samples) :][:1]
    size = -(-len(samples) // world.size)
    return (share * -(-size // len(share)))[:size]  # repeated as often as it needs, no more


def resolve_cache(
    cfg: TrainConfig, dataset: Dataset, device: torch.device, world: World = ONE_PROCESS
) -> str:
    """``cache=auto``'s choice, logged with the numbers it was made from
    (:func:`falconet.data.tiers.choose_tier`: ``gpu``, ``encoded``, ``stream``; ``none`` off
    CUDA, or where no GPU decoder is installed and the decoded images do not fit). The ranks of
    a distributed run agree on the slowest of their choices: one holding its shard while another
    drew from its share of the whole set would train some images twice an epoch and others
    never. Any other value is returned as it is."""
    if cfg.cache != "auto":
        return cfg.cache
    if device.type != "cuda":
        log.info("cache=auto: none (the GPU path needs a CUDA device; this run is on %s)", device)
        return "none"
    samples = gpu_shard(train_samples(cfg, dataset), world)
    free, _ = torch.cuda.mem_get_info(device)
    fixed = isinstance(cfg.batch, int) and cfg.batch > 0  # else autobatch's, later
    batch = per_rank_batch(cfg.batch, world) if fixed else 1
    footing = Footing(
        images=len(samples),
        decoded_bytes=store_bytes(len(samples), cfg.imgsz),
        encoded_bytes=None,
        ring_bytes=ring_bytes(ring_slots(batch, len(samples)), cfg.imgsz),
        gpu_free=free,
        host_available=host_available(),
        gpu_decoder=gpu_decoder() is not None,
    )
    if not footing.decoded_fits():  # the files are counted only where they matter
        sizes = file_sizes([s.image for s in samples])
        footing = replace(footing, encoded_bytes=int(sizes.clip(min=0).sum()))
    tier, why = choose_tier(footing)
    order = (*GPU_TIERS, "none")
    agreed = next(t for t in order if not any_rank(order.index(tier) > order.index(t), device))
    if agreed != tier:
        why = f"another rank's images take {agreed}"
    log.info("cache=auto: %s (%s; %s, on %s)", agreed, why, footing.describe(), device)
    return agreed


def host_cache(cache: str) -> str:
    """The CPU loader's cache for the run's ``cache``: ``none`` for a value of the GPU path or
    ``auto`` where no run resolved it for a device (:func:`resolve_cache`), as for a loader
    built on its own."""
    return cache if cache in CACHE_MODES else "none"


@dataclass(frozen=True)
class Encoded:
    """``cache=encoded`` or ``stream``: this rank's training samples and their files' bytes
    (held in host memory and filling, or read from disk at each use)."""

    samples: list[Sample]
    files: EncodedFiles


def fill_gpu_cache(
    cfg: TrainConfig,
    dataset: Dataset,
    device: torch.device,
    world: World = ONE_PROCESS,
    memory: tuple[int, int] | None = None,
) -> Filled | Encoded:
    """The GPU path's images for this rank (:func:`gpu_shard`): for ``cache=gpu`` decoded into
    ``device``'s memory (:mod:`falconet.data.gpu_cache`; ``memory`` as there); for
    ``cache=encoded`` the files' bytes, filling host memory beside training, for ``stream``
    their paths. Refused off CUDA."""
    if device.type != "cuda":
        raise ConfigError(
            f"cache={cfg.cache} decodes or keeps the images on the GPU and this run is on "
            f"{device.type}; use cache=ram"
        )
    start = time.perf_counter()
    gpu_render.compile_in_background(device, cfg.imgsz)  # while the store fills
    samples = gpu_shard(train_samples(cfg, dataset), world)
    shard = f", rank {world.rank}'s shard of {world.size}" if world.size > 1 else ""
    if cfg.cache != "gpu":
        files = EncodedFiles([s.image for s in samples], hold=cfg.cache == "encoded")
        files.start_filling()
        log.info(
            "cache=%s: %d files, %.2f GiB%s, decoded per batch by %s%s",
            cfg.cache,
            len(files),
            files.nbytes / 2**30,
            " (filling host memory beside training)" if files.hold else " (read per batch)",
            "nvJPEG" if gpu_decoder() is not None else "the CPU (pip install torchvision)",
            shard,
        )
        return Encoded(samples, files)
    filled = fill_store(samples, cfg.imgsz, device, memory=memory)
    log.info(
        "cache=gpu: %d images decoded in %.1f s (%d by nvJPEG, %d on the CPU)%s",
        filled.on_gpu + filled.on_cpu,
        time.perf_counter() - start,
        filled.on_gpu,
        filled.on_cpu,
        shard,
    )
    return filled


def build_loaders(
    cfg: TrainConfig,
    dataset: Dataset,
    device: torch.device,
    world: World = ONE_PROCESS,
    gpu_cache: Filled | Encoded | None = None,
) -> tuple[Any, torch.utils.data.DataLoader | None]:
    """The training loader (augmented, resumable sampler; in a distributed run this rank's
    share of every global batch) and the validation loader (this rank's share of the split).
    On the GPU path (``gpu_cache``, :func:`fill_gpu_cache`) the training batches are
    augmented on the GPU (:class:`~falconet.data.gpu_loader.GpuLoader`), from the decoded
    store or from a ring the files are decoded into (:mod:`falconet.data.gpu_decode`)."""
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
        if isinstance(gpu_cache, Filled):
            images = gpu_cache.store
        else:
            images = ring(cfg, gpu_cache, device, per_rank)
        loader = GpuLoader(train_set, images, per_rank, seed=rank_seed)
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


def ring(cfg: TrainConfig, encoded: Encoded, device: torch.device, batch: int) -> DecodedRing:
    """The ring ``cache=encoded`` and ``stream`` decode into, its size logged."""
    pool = ring_pool(batch, len(encoded.samples))
    log.info(
        "cache=%s: mosaic partners from the %d images decoded last, a ring of %.2f GiB on %s",
        cfg.cache,
        pool,
        ring_bytes(ring_slots(batch, len(encoded.samples)), cfg.imgsz) / 2**30,
        device,
    )
    share = cfg.cpu_decode
    if share == "auto":
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)  # torchrun's
        share = auto_cpu_share(thread_count(0, usable_cores(), local_ranks))
    ring = DecodedRing(
        encoded.samples, encoded.files, cfg.imgsz, device, pool, batch, cpu_share=share
    )
    if ring.decoder == "nvJPEG" and share > 0:
        log.info(
            "cache=%s: %.0f%% of the JPEG files decoded on the CPU's readers beside nvJPEG "
            "(cpu_decode=%s)",
            cfg.cache,
            100 * share,
            cfg.cpu_decode,
        )
    return ring


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
