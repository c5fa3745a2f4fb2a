"""Training on several processes with torch.distributed: the world, its batch, its collectives.

A run is distributed when it is launched by ``torchrun`` (``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE`` set): each process trains one shard of every global batch on its own device
(``cuda:LOCAL_RANK``, or the CPU), the network wrapped in ``DistributedDataParallel``, which
averages the gradients. The process group uses NCCL on CUDA devices and Gloo on the CPU, and
every collective waits at most ``dist_timeout`` seconds, after which the process fails with
the collective named, so a dead rank ends the job instead of hanging it.

``batch`` is the global batch: each rank trains ``batch // world_size`` images of it (the
sampler gives rank ``r`` every ``world_size``-th image of the epoch's permutation, so the
ranks' ``k``-th batches together are the single-process run's ``k``-th batch). A family's
loss normaliser that depends on the batch's content is summed over the ranks
(:func:`falconet.ops.rank_sum`), so two ranks at batch 8 train the problem one rank trains
at batch 16. Outside a distributed run every function here is a no-op.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from falconet.training.config import ConfigError

log = logging.getLogger("falconet.train")


@dataclass(frozen=True)
class World:
    """This process's place in the run: ``rank`` of ``size``, ``local_rank`` on its node."""

    rank: int = 0
    local_rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """Whether this process owns the run's side effects (run folder, logs, checkpoints)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


ONE_PROCESS = World()
"""The world of a run that is not distributed."""


def world_from_env(env: Mapping[str, str] | None = None) -> World:
    """The world torchrun describes in ``env`` (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``); one
    process when they are not set."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env:
        return ONE_PROCESS
    try:
        rank = int(env["RANK"])
        world = World(rank, int(env.get("LOCAL_RANK", rank)), int(env["WORLD_SIZE"]))
    except (KeyError, ValueError) as error:
        raise ConfigError(
            f"torchrun's environment is incomplete or not numbers ({error}): RANK, LOCAL_RANK "
            "and WORLD_SIZE must all be set; launch with torchrun, or unset WORLD_SIZE"
        ) from None
    if not 0 <= world.rank < world.size:
        raise ConfigError(f"RANK={world.rank} is not in 0..{world.size - 1} (WORLD_SIZE)")
    return world


def rank_device(spec: str, world: World) -> torch.device:
    """This rank's device for ``device=spec``: in a distributed run ``auto`` is
    ``cuda:LOCAL_RANK`` (the CPU without CUDA), a list ``0,1`` gives rank ``r`` its
    ``LOCAL_RANK``-th entry, ``cpu`` is the CPU. One process takes ``spec`` as it is
    (:func:`falconet.training.devices.resolve_device`); a list there needs a launcher."""
    from falconet.training.devices import resolve_device

    entries = [part.strip() for part in spec.split(",") if part.strip()]
    if not world.distributed:
        if len(entries) > 1:
            raise ConfigError(
                f"device={spec}: a device list starts one process per GPU through "
                f"Detector.train or `falconet train`, or launch them yourself: torchrun "
                f"--nproc-per-node {len(entries)} -m falconet train ... (docs/distributed.md)"
            )
        return resolve_device(spec)
    if spec.strip().lower() == "auto":
        spec = f"cuda:{world.local_rank}" if torch.cuda.is_available() else "cpu"
    elif len(entries) > 1:
        if len(entries) <= world.local_rank:
            raise ConfigError(
                f"device={spec} lists {len(entries)} devices for LOCAL_RANK {world.local_rank}"
            )
        spec = entries[world.local_rank]
    elif spec.strip().lower() != "cpu" and world.size > 1:
        raise ConfigError(
            f"device={spec}: one device for {world.size} ranks; use device=auto (each rank "
            "takes cuda:LOCAL_RANK), a list with one device per local rank, or device=cpu"
        )
    return resolve_device(spec)


def per_rank_batch(batch: int, world: World) -> int:
    """``batch // world.size``; a global batch that does not divide is refused, naming the
    nearest values that do."""
    if batch % world.size == 0:
        return batch // world.size
    below = batch - batch % world.size
    above = below + world.size
    nearest = [str(b) for b in (below, above) if b > 0]
    raise ConfigError(
        f"batch={batch} is the global batch and must divide by the world size "
        f"({world.size} processes); use batch={' or batch='.join(nearest)}"
    )


def start(world: World, device: torch.device, timeout_s: float) -> None:
    """Join the process group (NCCL on CUDA, Gloo on the CPU) with every collective bounded by
    ``timeout_s``; nothing outside a distributed run."""
    if not world.distributed or dist.is_initialized():
        return
    quiet_other_ranks(world)
    _end_with_launcher()
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend,
        store=_attempt_store(world, timeout),
        rank=world.rank,
        world_size=world.size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    log.info("distributed: rank %d of %d, %s on %s", world.rank, world.size, backend, device)


def quiet_other_ranks(world: World) -> None:
    """Ranks other than 0 log warnings and errors only, from the moment the process knows its
    rank: rank 0 says what the run does once, not once per rank."""
    if not world.main:
        logging.getLogger("falconet").setLevel(logging.WARNING)


SMALL_BATCH_NORM = 16
"""Below this many images per rank, BatchNorm's statistics are noisy enough to warn about."""


def batch_norm_across_ranks(
    model: torch.nn.Module, sync: bool, per_rank: int, world: World, device: torch.device
) -> torch.nn.Module:
    """``model`` with its BatchNorms synchronised over the ranks (``sync_bn=true``, GPUs only:
    SyncBatchNorm has no CPU kernels), or as it is, with a warning when each rank normalises
    over fewer than :data:`SMALL_BATCH_NORM` images. Outside a distributed run: as it is."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not world.distributed or not norms:
        return model
    if sync:
        if device.type != "cuda":
            raise ConfigError(
                "sync_bn=true needs CUDA devices (SyncBatchNorm has no CPU kernels); "
                "train with sync_bn=false on the CPU"
            )
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if per_rank < SMALL_BATCH_NORM and world.main:
        log.warning(
            "distributed: BatchNorm normalises over each rank's %d images (batch %d over %d "
            "ranks); sync_bn=true normalises over the global batch, at one all-reduce per "
            "BatchNorm",
            per_rank,
            per_rank * world.size,
            world.size,
        )
    return model


def replicate(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` wrapped in ``DistributedDataParallel``: its backward averages the gradients
    over the ranks (the model's parameters stay the trained ones; the step calls the
    wrapper). DDP's broadcast of the buffers before a forward is off: the step gives every
    rank rank 0's buffers (BatchNorm's running statistics) after each update, before the
    EMA reads them (``StepParts.collectives``), at one point that a recorded step can hold
    too, so the ranks hold one model, and one EMA of it, which validates their shares of the
    val split alike."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, **no_forward_buffer_sync())


def no_forward_buffer_sync() -> dict[str, bool]:
    """DDP's keyword that turns its buffer broadcast before each forward off: torch 2.15 names
    it ``forward_sync_buffers`` (and warns, once per rank, that ``broadcast_buffers`` is
    deprecated); earlier torch, the GPU machine's 2.11 among them, knows ``broadcast_buffers``
    only. The new one still syncs the buffers once at the wrapper's construction, which is
    harmless here: every rank builds the same network from the same seed."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def _attempt_store(world: World, timeout: datetime.timedelta) -> dist.Store | None:
    """The rendezvous store of a generation of workers torchrun restarted (elastic,
    ``--max-restarts``), under a prefix of its own; ``None`` (torchrun's environment as it is)
    on a first attempt. The store torchrun's agent keeps across restarts still holds the dead
    generation's addresses: a restarted rank could read its peer's old address before the peer
    wrote its new one, and Gloo then failed to connect (``connectFullMesh ... Connection
    refused``)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt in ("", "0"):
        return None
    from torch.distributed.rendezvous import rendezvous

    store, _, _ = next(rendezvous("env://", world.rank, world.size, timeout=timeout))
    return dist.PrefixStore(f"falconet/attempt_{attempt}", store)


def _end_with_launcher() -> None:
    """Ask Linux to kill this rank when its launcher dies: torchrun's agent killed with
    SIGKILL cannot stop its workers (:mod:`falconet.training.parent_death`)."""
    import signal

    from falconet.training.parent_death import end_with_parent

    end_with_parent(signal.SIGKILL)


def stop(*, together: bool = True) -> None:
    """Leave the process group. ``together`` (a run that ended well): first wait for every
    rank (rank 0 may still be writing its last checkpoint), since a rank that tore its group
    down while another still used it could abort at exit; after a failure, leave at once."""
    if dist.is_available() and dist.is_initialized():
        if together and dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()


def active() -> bool:
    """Whether this process is in a process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def any_rank(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` is true on any rank (one all-reduce; ``flag`` itself outside a
    distributed run): every rank takes the same decision, so none waits on a collective the
    others skipped."""
    if not active():
        return flag
    # on the device the group's backend takes: NCCL's CUDA device, Gloo's host memory
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    value = torch.tensor([int(flag)], device=on)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def share(value: Any, device: torch.device) -> Any:
    """Rank 0's ``value`` (picklable) on every rank: the run folder rank 0 made, the batch
    autobatch chose."""
    if not active():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, device=device if device.type == "cuda" else None)
    return box[0]


def gather_states(state: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Every rank's ``state`` on rank 0 (in rank order), ``None`` on the others;
    ``[state]`` outside a distributed run. For validation: each rank predicts its share of
    the val split and rank 0 scores them all once."""
    if not active():
        return [state]
    states: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(state, states, dst=0)
    return states
