"""The run's data loaders: the augmented training loader and the validation loader."""

from __future__ import annotations

import os

import torch

from falconet.data.loader import DetectionDataset, build_loader
from falconet.data.records import Dataset
from falconet.data.transforms import AugmentConfig
from falconet.training.config import TrainConfig
from falconet.training.distributed import ONE_PROCESS, World, per_rank_batch


def augment_config(cfg: TrainConfig) -> AugmentConfig:
    return AugmentConfig(
        mosaic=cfg.mosaic,
        degrees=cfg.degrees,
        translate=cfg.translate,
        scale=cfg.scale,
        hsv_h=cfg.hsv_h,
        hsv_s=cfg.hsv_s,
        hsv_v=cfg.hsv_v,
        fliplr=cfg.fliplr,
    )


def worker_count(requested: int) -> int:
    return min(requested, os.cpu_count() or 1)


def build_loaders(
    cfg: TrainConfig, dataset: Dataset, device: torch.device, world: World = ONE_PROCESS
) -> tuple[torch.utils.data.DataLoader, torch.utils.data.DataLoader | None]:
    """The training loader (augmented, resumable sampler; in a distributed run this rank's
    share of every global batch) and the validation loader (this rank's share of the split)."""
    train = dataset.splits["train"].samples
    if cfg.fraction < 1:
        train = train[: max(1, round(len(train) * cfg.fraction))]
    workers = worker_count(cfg.workers)
    pin = device.type == "cuda"
    close_from = cfg.epochs - cfg.close_mosaic if cfg.close_mosaic else None
    train_set = DetectionDataset(
        train,
        cfg.imgsz,
        augment=augment_config(cfg),
        cache=cfg.cache,
        seed=cfg.seed,
        close_mosaic_from=close_from,
    )
    train_loader = build_loader(
        train_set,
        per_rank_batch(cfg.batch, world),
        workers=workers,
        shuffle=True,
        seed=cfg.seed,
        rank=world.rank,
        world_size=world.size,
        pin_memory=pin,
    )
    val_loader = build_val_loader(cfg, dataset, device, world) if cfg.val else None
    return train_loader, val_loader


def build_val_loader(
    cfg: TrainConfig, dataset: Dataset, device: torch.device, world: World = ONE_PROCESS
) -> torch.utils.data.DataLoader:
    """Letterboxed val images in order, twice the training batch per step (per rank: each
    rank predicts every ``world.size``-th image, and rank 0 scores them all)."""
    val_set = DetectionDataset(dataset.splits["val"].samples, cfg.imgsz, cache=cfg.cache)
    return build_loader(
        val_set,
        per_rank_batch(cfg.batch, world) * 2,
        workers=worker_count(cfg.workers),
        shuffle=False,
        rank=world.rank,
        world_size=world.size,
        pin_memory=device.type == "cuda",
    )
