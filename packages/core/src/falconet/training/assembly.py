"""Assembling a run from its plan: every part the loop and the step are made of, in order.

:func:`assemble` reads as the list of what a run is: the device and its seeds, the data, the
network (with its starting weights), the precision, the loss with its assigner, the loaders,
the optimizer with its schedule, the scaler, the EMA, and the step that the chosen graph
backend builds from those parts (:mod:`falconet.contract.step`). Each part comes from a
registry, so a plugin's part is assembled exactly as a built-in one.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from falconet import ops
from falconet.contract import (
    GraphContext,
    ModelFamily,
    PrecisionBackend,
    PrecisionContext,
    Progress,
    StepParts,
    TrainStep,
)
from falconet.data.gpu_cache import Filled
from falconet.data.records import DataError, Dataset
from falconet.data.resolve import load_dataset
from falconet.data.tiers import GPU_TIERS
from falconet.loss_scaler import LossScaler
from falconet.plugins import Plugins
from falconet.training.autobatch import (
    box_count,
    peak_of,
    quiet,
    refuse_off_gpu,
    timed_choice,
    wanted_fraction,
)
from falconet.training.backends import choose_graph, choose_precision, step_replays
from falconet.training.checkpoint import load_matching_weights
from falconet.training.collectives import rank_collectives
from falconet.training.config import TrainConfig
from falconet.training.devices import configure_determinism
from falconet.training.distributed import (
    World,
    batch_norm_across_ranks,
    per_rank_batch,
    rank_device,
    replicate,
    share,
    world_from_env,
)
from falconet.training.distributed import start as start_distributed
from falconet.training.first_use import run_beside_first_use, synthetic_batch
from falconet.training.loaders import (
    Encoded,
    build_loaders,
    fill_gpu_cache,
    resolve_cache,
    train_samples,
)
from falconet.training.multi_scale import largest_size
from falconet.training.optimization import ModelEMA, Schedule, build_optimizer
from falconet.training.phases import Phases
from falconet.training.planning import ModelSpec, Plan
from falconet.training.startup_clock import StartupClock
from falconet.training.threads import apply_threads

log = logging.getLogger("falconet.train")

IMPORTED_ANYWAY = ("torch._dynamo",)
"""The slow imports a run makes later anyway, made ahead (:mod:`falconet.training.first_use`):
``torch._dynamo``, which ``torch.optim``'s ``add_param_group`` imports."""


@dataclass
class Run:
    """Everything a run is made of (:func:`assemble`); the loop owns it."""

    config: TrainConfig
    world: World
    family: ModelFamily
    spec: ModelSpec
    dataset: Dataset
    device: torch.device
    precision: PrecisionBackend
    model: nn.Module
    train_loader: Any  # a DataLoader, or cache=gpu's GpuLoader (same batches and sampler)
    val_loader: torch.utils.data.DataLoader | None
    accumulate: int
    optimizer: torch.optim.Optimizer
    scaler: LossScaler | None
    ema: ModelEMA | None
    parts: StepParts
    graph: str
    step: TrainStep

    @property
    def progress(self) -> Progress:
        return self.parts.progress

    @property
    def phases(self) -> Phases:
        return self.parts.phases


def assemble(plan: Plan, plugins: Plugins) -> Run:
    """Build every part of ``plan``'s run, and its step from the chosen graph backend."""
    cfg = plan.config
    clock = StartupClock()
    world = world_from_env()
    fraction = wanted_fraction(cfg.batch)
    if fraction is None:
        per_rank_batch(cfg.batch, world)  # before anything starts
    device = rank_device(cfg.device, world)
    if fraction is not None:
        refuse_off_gpu(device, cfg.batch)
    start_distributed(world, device, cfg.dist_timeout)
    configure_determinism(cfg.seed, cfg.deterministic, device)
    apply_threads(cfg.threads)
    clock.mark("device")
    dataset = load_training_data(cfg)
    clock.mark("data")
    cfg = cfg.model_copy(update={"cache": resolve_cache(cfg, dataset, device, world)})
    clock.mark("cache choice")
    batch = per_rank_batch(cfg.batch, world) if fraction is None else None  # autobatch: later
    replays = step_replays(cfg.graph, plugins)
    context = PrecisionContext(
        device, cfg.model_dump(), batch, cfg.imgsz, world.size, replays=replays
    )
    precision = choose_precision(cfg.amp_dtype, context, plugins)
    model = gpu_cache = None
    if batch is not None:  # autobatch's probes use the GPU first instead
        model = build_network(plan, len(dataset.names), precision, device)
        clock.mark("network")
        synthetic = (batch, cfg.imgsz, synthetic_boxes(cfg, dataset), len(dataset.names))
        loss_for = functools.partial(build_loss, plan, plugins)
        # the memory the store is checked against: the device's before the copy takes any
        memory = torch.cuda.mem_get_info(device) if device.type == "cuda" else None

        def start_up() -> Filled | Encoded | None:
            if cfg.cache not in GPU_TIERS:
                return None
            return fill_gpu_cache(cfg, dataset, device, world, memory)

        gpu_cache = run_beside_first_use(
            start_up, model, loss_for, precision, synthetic, device, IMPORTED_ANYWAY
        )
        clock.mark("first use and store" if cfg.cache in GPU_TIERS else "first use")
    if cfg.cache in GPU_TIERS and gpu_cache is None:
        gpu_cache = fill_gpu_cache(cfg, dataset, device, world)
        clock.mark("store")
    if model is None:  # after the GPU cache, whose memory the step cannot have
        batch = autobatched(plan, plugins, dataset, precision, device, world, fraction)
        cfg = cfg.model_copy(update={"batch": batch})
        clock.mark("autobatch")
        model = build_network(plan, len(dataset.names), precision, device)
        clock.mark("network")
    per_rank = per_rank_batch(cfg.batch, world)
    model = batch_norm_across_ranks(model, cfg.sync_bn, per_rank, world, device)
    loss = build_loss(plan, plugins, model)
    clock.mark("loss")
    train_loader, val_loader = build_loaders(cfg, dataset, device, world, gpu_cache)
    clock.mark("loaders")
    batches = train_loader.batch_sampler.batches_per_epoch
    accumulate = max(round(cfg.nbs / cfg.batch), 1)
    optimizer = build_optimizer(model, cfg, accumulate)
    scaler = precision.grad_scaler(device)
    ema = ModelEMA(model, cfg.ema_decay, cfg.ema_tau) if cfg.ema else None
    parts = StepParts(
        model=model,
        loss=loss,
        optimizer=optimizer,
        precision=precision,
        scaler=scaler,
        ema=ema,
        clip_grad=cfg.clip_grad,
        loss_gain=float(cfg.batch),
        schedule=Schedule(cfg, math.ceil(batches / accumulate)),
        progress=Progress(),
        phases=Phases(),
        device=device,
        replicate=functools.partial(replicate, device=device) if world.distributed else None,
        collectives=rank_collectives(world.size, cfg.dist_timeout),
    )
    context = graph_context(plan.family, plugins, cfg, parts, world)
    graph, backend = choose_graph(cfg.graph, context, model, plugins)
    step = backend.build_step(parts, context)
    clock.mark("step")
    log.info("%s", clock.summary())
    return Run(
        config=cfg,
        world=world,
        family=plan.family,
        spec=ModelSpec(plan.family.name, plan.model_name, tuple(dataset.names)),
        dataset=dataset,
        device=device,
        precision=precision,
        model=model,
        train_loader=train_loader,
        val_loader=val_loader,
        accumulate=accumulate,
        optimizer=optimizer,
        scaler=scaler,
        ema=ema,
        parts=parts,
        graph=graph,
        step=step,
    )


def build_loss(plan: Plan, plugins: Plugins, model: nn.Module) -> Any:
    """The family's loss for ``model`` with the run's assigner."""
    return plan.family.build_loss(model, plugins.assigners.get(plan.config.assigner))


def synthetic_boxes(cfg: TrainConfig, dataset: Dataset) -> int:
    """Boxes per image of a synthetic batch for this run (:func:`box_count`)."""
    train = train_samples(cfg, dataset)
    return box_count(sum(len(s.labels) for s in train) / max(len(train), 1), cfg.mosaic)


def graph_context(
    family: ModelFamily, plugins: Plugins, cfg: TrainConfig, parts: StepParts, world: World
) -> GraphContext:
    """What the graph backends decide by for the step of ``parts``: among it the family's
    capture region, and whether its loss with the run's assigner is static on the device."""
    assigner = plugins.assigners.get(cfg.assigner)
    return GraphContext(
        parts.device,
        parts.precision,
        world_size=world.size,
        capture_region=family.capture_region(parts.model),
        static_loss=family.static_loss(assigner, parts.device),
        optimizer=parts.optimizer,
        scaler=parts.scaler,
        config=cfg,
    )


def autobatched(
    plan: Plan,
    plugins: Plugins,
    dataset: Dataset,
    precision: PrecisionBackend,
    device: torch.device,
    world: World,
    fraction: float,
) -> int:
    """The global batch autobatch chose (:mod:`falconet.training.autobatch`): rank 0 measures
    the run's step on its GPU, every rank takes its choice."""
    cfg = plan.config
    per_rank = None
    if world.main:
        boxes = synthetic_boxes(cfg, dataset)

        def measure(batch: int) -> int | None:
            return peak_of(
                lambda: probe_step(plan, plugins, dataset, precision, device, world, batch, boxes),
                device,
            )

        # a larger batch has no more images than the rank's share of the split
        share_of_split = -(-len(train_samples(cfg, dataset)) // world.size)
        per_rank = timed_choice(measure, device, fraction, largest=share_of_split).batch
    per_rank = share(per_rank, device)
    return per_rank * world.size


PROBE_CALLS = 8
"""The most training steps a probe runs (it stops once the backend has replayed)."""


def probe_step(
    plan: Plan,
    plugins: Plugins,
    dataset: Dataset,
    precision: PrecisionBackend,
    device: torch.device,
    world: World,
    batch: int,
    boxes: int,
) -> None:
    """Train the run's step (its graph backend's, recordings included) at ``batch`` images
    of ``boxes`` boxes each until the backend replays, then validate a batch twice as large
    while the step is still held: the memory a run's epoch and its validation need."""
    cfg = plan.config.model_copy(update={"batch": batch})
    with quiet(), ops.rank_local():  # rank 0 alone: the others wait for its choice
        model = build_network(plan, len(dataset.names), precision, device)
        parts = StepParts(
            model=model,
            loss=build_loss(plan, plugins, model),
            optimizer=build_optimizer(model, cfg, 1),
            precision=precision,
            scaler=precision.grad_scaler(device),
            ema=ModelEMA(model, cfg.ema_decay, cfg.ema_tau) if cfg.ema else None,
            clip_grad=cfg.clip_grad,
            loss_gain=float(batch),
            schedule=Schedule(cfg, 1),
            progress=Progress(),
            phases=Phases(),
            device=device,
        )
        context = graph_context(plan.family, plugins, cfg, parts, world)
        step = choose_graph(cfg.graph, context, model, plugins)[1].build_step(parts, context)
        # the largest size multi_scale trains at is what must fit (validation is at imgsz)
        size = largest_size(cfg.multi_scale, cfg.imgsz)
        images, targets = synthetic_batch(batch, size, boxes, len(dataset.names), device)
        for call in range(PROBE_CALLS):
            step(images, targets, update=True)
            stats = step.stats()
            done = stats.replayed > 0 or stats.failed > 0 or stats.captures == 0
            if call >= 1 and not stats.pending and done:
                break
        network = parts.ema.module if parts.ema is not None else model.eval()
        sizes = [(cfg.imgsz, cfg.imgsz)] * (2 * batch)
        with torch.no_grad(), precision.autocast(device):
            outputs = network(torch.rand(2 * batch, 3, cfg.imgsz, cfg.imgsz, device=device))
            plan.family.postprocess(outputs, sizes, conf=0.001, multi_label=True)


def load_training_data(cfg: TrainConfig) -> Dataset:
    """The dataset's train split (and val split when ``val``), checked and summarised."""
    dataset = load_dataset(cfg.data, splits=("train", "val") if cfg.val else ("train",))
    dataset.require_usable()
    if cfg.val and "val" not in dataset.splits:
        raise DataError(f"data={cfg.data}: has no val split; add `val:` or pass val=false")
    for split in dataset.splits.values():
        (log.warning if split.problems else log.info)("data %s", split.summary())
    return dataset


def build_network(
    plan: Plan, num_classes: int, precision: PrecisionBackend, device: torch.device
) -> nn.Module:
    """The family's network with the plan's starting weights (those whose shapes match),
    wrapped by the precision backend, channels-last on ``device``."""
    model = plan.family.build_model(plan.model_name, num_classes)
    if plan.start_weights is not None:
        loaded, left_out = load_matching_weights(model, plan.start_weights)
        skipped = f" (left out, shapes differ: {', '.join(left_out[:6])}" + (
            ", ...)" if len(left_out) > 6 else ")"
        )
        log.info(
            "weights: %d of %d tensors from the starting checkpoint%s",
            loaded,
            loaded + len(left_out),
            skipped if left_out else "",
        )
    model = precision.wrap_model(model)
    return model.to(device, memory_format=torch.channels_last)


def describe(run: Run, run_dir: Any) -> str:
    """The run's one-line summary for the log."""
    val = len(run.val_loader.dataset) if run.val_loader else "no"
    return (
        f"run {run_dir}: {run.spec.model} on {run.device}, {run.precision.name}, "
        f"graph={run.graph}, {len(run.train_loader.dataset)} train / {val} val images, "
        f"accumulate {run.accumulate}"
    )
