"""The ``profiler`` callback that ``profile=true`` adds to a run.

It counts batches from the start of the run. It discards the batches up to the run's first
optimizer step (which creates the optimizer's state, and after which a backend that records
the whole step can capture; ``accumulate`` batches) and ``profile_warmup`` more; then it
swaps its :class:`~falconet_profiler.window.PhaseClock` in as ``run.phases``; it measures
``profile_steps`` batches: the first half unsynchronised and untraced (the real step time and
loader wait; its last batch ends when the device has finished the half, so a host that runs
ahead of the GPU does not make the step look shorter), the second half synchronised around
each phase and, on CUDA, under torch.profiler (kernel figures; GPU busy is their GPU time
per batch over the first half's step time). Then it restores ``run.phases``, stops the
profiler, writes the artifacts into the run folder, logs the report and lets training go on,
or, with ``profile_then_stop``, asks the run to stop (:meth:`RunState.request_stop`).
When ``profile`` is off the callback is not in the run at all.

Graph backends record a CUDA graph for each new shape (a backend that records the loss too,
for each new target bucket) on its third call; a capture costs tens to hundreds of
milliseconds and allocates, so a window that holds one would report that cost (and its
``cudaMalloc`` calls) as the step's.
A capture during the discarded batches or the unsynchronised half moves the window so that it
starts only after ``profile_warmup`` batches in a row without one (at most
``MAX_WAIT_BATCHES`` more batches); captures during the synchronised half are counted in
``profile.json`` (``window.graph_captures``). Captures are read from the run's step
(``run.step_stats()``, a :class:`~falconet.contract.CaptureStats` whose ``recorded`` and
``failed`` say how many it has tried). A step that is ``pending`` (it will record but has not
yet: before its first key has repeated, or with AdamW before its first step) moves
the window the same way, so the eager batches before its first recording are not timed as
the backend's; batches it ran eagerly inside the window anyway are counted
(``window.eager_batches``) and the report says so.

Distributed runs: a run's callbacks run on rank 0 only, so rank 0 profiles its own steps
(the report says which rank of how many) and waits on no other rank; with
``profile_then_stop`` the run ends at the end of that epoch on every rank (a stop reaches
the ranks at epoch ends, docs/distributed.md).
"""

from __future__ import annotations

import datetime
import logging
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

from falconet_profiler.window import BatchRecord, PhaseClock, Window, half_timing

if TYPE_CHECKING:
    from falconet.training.run_state import RunState

log = logging.getLogger("falconet.profile")

MAX_WAIT_BATCHES = 200
"""How many batches past ``profile_warmup`` the window may be moved to wait out captures."""


class Profiler:
    """Callback factory and callback: ``Profiler()`` is added by ``profile=true``.

    :param rank: this process's rank (default: the run's, :attr:`RunState.rank`); only
        rank 0 measures and writes.
    """

    name = "profiler"
    summary = "profile=true: times a window of training steps and says why a step is slow"

    @staticmethod
    def wanted(config: Any) -> bool:
        """Added to every run with ``profile=true`` (the key is this plugin's own)."""
        return bool(config.profile)

    def __init__(self, *, rank: int | None = None, **options: Any) -> None:
        self.forced_rank = rank
        self.active = False
        self.records: list[BatchRecord] = []

    # ------------------------------------------------------------------------- callbacks
    def on_train_start(self, run: RunState) -> None:
        cfg = run.config
        first_update = run.accumulate - 1  # the batch of the first optimizer step
        self.window = Window(first_update + cfg.profile_warmup, cfg.profile_steps)
        self.world_size = run.world_size
        self.rank = run.rank if self.forced_rank is None else self.forced_rank
        self.measuring = self.rank == 0
        if not self.measuring:
            log.info("profiler: rank %d does not profile; rank 0 does", self.rank)
        self.cuda = run.device.type == "cuda"
        self.clock = PhaseClock()
        self.seen = 0
        self.switched = False
        self.active = True
        self.torch_profiler = None
        self.memory: list[dict[str, Any]] = []
        stats = run.step_stats()
        self.captures = stats.captures
        self.captures_in_window = 0
        self.eager = stats.eager
        self.eager_in_window = 0
        self._prepare(run)

    def on_step_end(self, run: RunState) -> None:
        if not self.active:
            return
        if self.measuring and self.clock.batch is not None:
            if self.window.part(self.seen) == "unsynced" != self.window.part(self.seen + 1):
                self._drain(run)
            record = self.clock.end_batch()
            record.epoch, record.batch_in_epoch = run.epoch, run.batch_in_epoch
            record.images = _images_in(run, run.batch_in_epoch)
            self.records.append(record)
        self._follow_captures(run)
        eager = run.step_stats().eager
        if eager != self.eager and self.window.part(self.seen) in ("unsynced", "synced"):
            self.eager_in_window += 1
        self.eager = eager
        self.seen += 1
        if self.window.part(self.seen) == "after":
            self._finish(run)
        else:
            self._prepare(run)

    def on_train_end(self, run: RunState) -> None:
        if not self.active:
            return
        measured = sum(r.part == "unsynced" for r in self.records)
        log.warning(
            "profiler: the run ended after %d of the window's %d batches (%d discarded + %d "
            "measured)%s",
            self.seen,
            self.window.end,
            self.window.warmup,
            self.window.steps,
            "; reporting the batches measured" if measured else "; nothing to report",
        )
        self._finish(run, write=measured > 0)

    def on_exception(self, run: RunState, exc: BaseException) -> None:
        if self.active:
            self._finish(run, write=False)

    # ---------------------------------------------------------------------------- window
    def _drain(self, run: RunState) -> None:
        """End the unsynchronised half's last batch when the device has finished the half's
        work. The host may run ahead of the GPU (a replayed graph launches in microseconds
        and nothing syncs), and then the half's host time alone would undercount the step:
        the window starts synchronised, so the half's time is the device's."""
        if self.cuda:
            import torch

            torch.cuda.synchronize(run.device)

    def _follow_captures(self, run: RunState) -> None:
        """After batch ``self.seen``: if the graph backend captured during it, or the run's
        step is still pending, start the window ``profile_warmup`` batches later (dropping
        an unsynchronised half begun), or, in the synchronised half or past the wait limit,
        count the capture."""
        stats = run.step_stats()
        captures = stats.captures
        captured = captures != self.captures
        self.captures = captures
        pending = stats.pending
        if not (captured or pending):
            return
        part = self.window.part(self.seen)
        warmup = run.config.profile_warmup
        start = self.seen + 1 + warmup
        if part not in ("warmup", "unsynced") or start > warmup + MAX_WAIT_BATCHES:
            self.captures_in_window += captured
            return
        if part == "unsynced" and self.measuring:
            why = "a graph capture" if captured else "the step still eager (pending)"
            log.info("profiler: %s at batch %d; the window starts again", why, self.seen)
            run.phases.reset()
            self.clock.batch = None
            self.records.clear()
            self.memory.clear()
            self.eager_in_window = 0
        self.window = Window(max(start, self.window.warmup), self.window.steps)

    def _prepare(self, run: RunState) -> None:
        """Before batch ``self.seen``: start the window, switch halves, open its record."""
        part = self.window.part(self.seen)
        if part == "warmup" or not self.measuring:
            return
        if self.seen == self.window.warmup:
            self._start(run)
        if part == "synced" and not self.switched:
            self.switched = True
            self._memory_snapshot(run)
            if self.cuda:
                import torch

                self.clock.synchronize = torch.cuda.synchronize
                self._start_trace(run)
        self.clock.batch = BatchRecord(self.seen, part)

    def _start(self, run: RunState) -> None:
        run.phases.use(self.clock)
        if not self.cuda:
            return
        import torch

        torch.cuda.synchronize(run.device)
        torch.cuda.reset_peak_memory_stats(run.device)
        self._memory_snapshot(run)

    def _start_trace(self, run: RunState) -> None:
        """torch.profiler over the synchronised half only: its per-operation cost on the host
        would make the unsynchronised half's step time, which decides the verdict, unreal."""
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function

        torch.cuda.synchronize(run.device)
        self.torch_profiler = profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
            record_shapes=False,
            profile_memory=False,
            with_stack=False,
        )
        self.torch_profiler.__enter__()
        self.clock.annotate = record_function

    def _memory_snapshot(self, run: RunState) -> None:
        if self.cuda:
            import torch

            self.memory.append(torch.cuda.memory_stats(run.device))

    def _finish(self, run: RunState, *, write: bool = True) -> None:
        self.active = False
        run.phases.reset()
        self.clock.batch = None
        trace_path = Path(run.run_dir) / "profile_trace.json"
        gpu = None
        if self.torch_profiler is not None:
            import torch

            torch.cuda.synchronize(run.device)
            self._memory_snapshot(run)
            self.torch_profiler.__exit__(None, None, None)
            if write:
                from falconet_profiler.trace import analyse, load_trace

                self.torch_profiler.export_chrome_trace(str(trace_path))
                gpu = analyse(load_trace(trace_path))
            self.torch_profiler = None
        if write and self.measuring:
            self._write(run, gpu, trace_path)
        if run.config.profile_then_stop and self.seen >= self.window.end:
            run.request_stop(
                f"stopped after profiling (profile_then_stop=true): {self.window.end} batches, "
                f"see {Path(run.run_dir) / 'profile.json'}"
            )

    def _write(self, run: RunState, gpu: dict[str, Any] | None, trace_path: Path) -> None:
        from falconet_profiler.report import format_report, write_artifacts, write_json
        from falconet_profiler.trace import host_trace

        doc = self.document(run, gpu)
        if gpu is None:
            write_json(trace_path, host_trace(doc["batches"]))
        write_artifacts(Path(run.run_dir), doc)
        log.info("%s", format_report(doc, Path(run.run_dir)))

    # -------------------------------------------------------------------------- document
    def document(self, run: RunState, gpu: dict[str, Any] | None) -> dict[str, Any]:
        """``profile.json`` for this run's window (see :mod:`falconet_profiler.report`)."""
        import torch

        from falconet import __version__
        from falconet_profiler import SCHEMA
        from falconet_profiler.report import KIND, evidence_of
        from falconet_profiler.trials import with_trials
        from falconet_profiler.verdict import Context, decide

        cfg = run.config
        options = cfg.model_dump()
        fast = [r for r in self.records if r.part == "unsynced"]
        slow = [r for r in self.records if r.part == "synced"]
        unsynced = half_timing(fast, run.accumulate)
        synced = half_timing(slow, run.accumulate)
        memory = self._memory_figures(run, len(fast))
        lanes = gpu.pop("lanes", None) if gpu else None
        if gpu:  # busy: the traced half's GPU time per batch over the real step time
            step_ms = unsynced["step_ms"]["mean"]
            gpu["gpu_busy"] = min(gpu["gpu_ms_per_step"] / step_ms, 1.0) if step_ms else 0.0
        if gpu and synced["phases"]:
            for name, ms in gpu.get("phase_gpu_ms", {}).items():
                if name in synced["phases"]:
                    synced["phases"][name]["gpu_ms_per_batch"] = ms
        evidence = evidence_of(unsynced, gpu, memory)
        context = Context(
            device=run.device.type,
            graph=run.graph,
            precision=run.precision,
            batch=cfg.batch,
            workers=cfg.workers,
            cache=cfg.cache,
            gpu_store_fits=gpu_store_fits(run),
            cpu_count=os.cpu_count() or 1,
            options=options,
            graphs=run.installed.graph_backends,
            precisions=run.installed.precision_backends,
            levers=run.installed.levers,
            distributions=run.installed.distributions,
        )
        origin = self.records[0].start if self.records else 0
        device_name = torch.cuda.get_device_name(run.device) if self.cuda else platform.processor()
        doc = {
            "schema": SCHEMA,
            "kind": KIND,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "versions": {
                "falconet": __version__,
                "falconet-profiler": _version(),
                "torch": str(torch.__version__),
                "cuda": torch.version.cuda,
            },
            "run": {
                "run_dir": str(run.run_dir),
                "model": run.model,
                "data": cfg.data,
                "device": run.device.type,
                "device_name": device_name or run.device.type,
                "precision": run.precision,
                "graph": run.graph,
                "batch": cfg.batch,
                "imgsz": cfg.imgsz,
                "workers": cfg.workers,
                "cache": cfg.cache,
                "accumulate": run.accumulate,
                "world_size": self.world_size,
                "rank": self.rank,
            },
            "window": {
                "warmup": self.window.warmup,
                "steps": self.window.steps,
                "unsynced": len(fast),
                "synced": len(slow),
                "complete": self.seen >= self.window.end,
                "graph_captures": self.captures_in_window,
                "eager_batches": self.eager_in_window,
            },
            "unsynced": unsynced,
            "synced": synced,
            "gpu": gpu,
            "memory": memory,
            "evidence": evidence,
            "verdict": decide(evidence, context),
            "batches": [r.to_json(origin) for r in self.records],
            "lanes": lanes,
        }
        return with_trials(doc)

    def _memory_figures(self, run: RunState, fast_batches: int) -> dict[str, Any] | None:
        """Allocator figures of the unsynchronised half (snapshots at the window's start and
        at the switch) and the window's peaks; ``None`` on the CPU."""
        if not self.cuda or len(self.memory) < 2:
            return None
        import torch

        first, switch = self.memory[0], self.memory[1]
        total = torch.cuda.get_device_properties(run.device).total_memory
        reserved = torch.cuda.max_memory_reserved(run.device)
        mallocs = switch.get("segment.all.allocated", 0) - first.get("segment.all.allocated", 0)
        return {
            "peak_allocated_gib": torch.cuda.max_memory_allocated(run.device) / 2**30,
            "peak_reserved_gib": reserved / 2**30,
            "device_total_gib": total / 2**30,
            "peak_reserved_fraction": reserved / total,
            "alloc_retries": switch.get("num_alloc_retries", 0) - first.get("num_alloc_retries", 0),
            "cuda_malloc_per_step": mallocs / max(fast_batches, 1),
        }


def _images_in(run: RunState, batch_in_epoch: int) -> int:
    """Images in the epoch's ``batch_in_epoch``-th batch (the last one may be short)."""
    size = run.train_images
    batch = run.config.batch
    return max(0, min(batch, size - (batch_in_epoch - 1) * batch))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("falconet-profiler")
    except PackageNotFoundError:
        return "unknown"


def gpu_store_fits(run: RunState) -> bool | None:
    """Whether this rank's training images would fit ``cache=gpu``'s store, by the rule the
    start-up applies (at most half the free memory before training, which is about what is
    free now plus what torch holds for the run); ``None`` off CUDA."""
    import torch

    from falconet.data.gpu_cache import store_fits

    if run.device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(run.device)
    shard = -(-run.train_images // run.world_size)
    return store_fits(shard, run.config.imgsz, free + torch.cuda.memory_reserved(run.device))
