"""The training loop: one loop for every family, precision and graph backend.

The run's parts are assembled once (:func:`falconet.training.assembly.assemble`); the loop
fetches each batch and moves it to the device (the ``data`` and ``to-device`` phases), calls
the run's step (:class:`falconet.contract.TrainStep`, built by the graph backend) with
``update`` on every ``accumulate``-th batch and on an epoch's last, and keeps the epoch's
bookkeeping on the device: losses and the non-finite counter are summed there and read every
``log_interval`` batches (one interval late, without waiting for the GPU:
:class:`~falconet.training.log_reads.LaggedReads`) and at the end of an epoch, so nothing in a
step reads a device value back to the host. An epoch ends with an optimizer step, so an epoch
boundary holds no pending gradient: checkpoints are written there and ``resume`` continues from
the last one exactly.

Callbacks see the run through :class:`falconet.training.run_state.RunState`, never the
trainer.
"""

from __future__ import annotations

import logging
import math
import textwrap
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import yaml

from falconet import __version__
from falconet.data.loader import stop_workers
from falconet.data.targets import Targets
from falconet.evaluation.contract import EvalResult
from falconet.plugins import Plugins
from falconet.training import collector, distributed, validation
from falconet.training.assembly import assemble, describe
from falconet.training.callbacks import CallbackList
from falconet.training.checkpoint import (
    FORMAT,
    CheckpointWriter,
    restore_rng_states,
    rng_states,
)
from falconet.training.config import ConfigError, format_value
from falconet.training.log_reads import LaggedReads
from falconet.training.multi_scale import rescale, size_draw
from falconet.training.planning import Plan
from falconet.training.run_dir import new_run_dir
from falconet.training.run_state import Installed, RunState

log = logging.getLogger("falconet.train")

METRIC_COLUMNS = ("metrics/mAP50-95", "metrics/mAP50", "metrics/mAR100", "fitness")
RELEASE_WRITE_BY = 32
"""The batch of an epoch by which the previous epoch's checkpoint write is released at the
latest (:func:`write_release_batch`)."""


def write_release_batch(batches_per_epoch: int) -> int:
    """The batch (1-based) after whose launch the previous epoch's files may serialise: the
    middle of the epoch, and no later than :data:`RELEASE_WRITE_BY`. Serialising holds the GIL;
    as the epoch starts, with the GPU's queue drained by the epoch's last log read, it held
    back the training thread's first launches and the GPU waited. A few batches in, the
    training thread is ahead of the GPU; the cap keeps a long epoch's files from landing
    half an epoch late (a crash before they land resumes from the epoch before)."""
    return max(1, min((batches_per_epoch + 1) // 2, RELEASE_WRITE_BY))


class TrainingDiverged(RuntimeError):
    """The loss stayed non-finite; the last good checkpoint is kept."""


class Trainer:
    """A training run assembled from registered parts; :meth:`fit` runs it."""

    def __init__(self, plan: Plan, plugins: Plugins, callbacks: Iterable[Any] = ()) -> None:
        self.plugins = plugins
        with collector.paused():  # what the start-up makes lives as long as the run
            self.run = run = assemble(plan, plugins)
        self.cfg = cfg = run.config
        self.progress = run.progress
        self._batches: Iterator[dict[str, Any]] | None = None  # one iterator over all epochs
        self._val_batches: Iterator[dict[str, Any]] | None = None  # started with the epoch
        self.bad_validations = 0
        self.best, self.best_epoch = -math.inf, 0
        self.best_eval: EvalResult | None = None
        self.stop_reason = ""
        self._stop_after_batch = False  # request_stop: end the run after the current batch
        main = run.world.main  # rank 0 owns every side effect of a distributed run
        distributed.quiet_other_ranks(run.world)
        self.callbacks = CallbackList(callbacks if main else ())
        if plan.resume_state is not None:
            self.run_dir = plan.resume_path.resolve().parent.parent
            self._restore(plan.resume_state)
        else:
            made = str(new_run_dir(cfg.project, cfg.name, cfg.exist_ok).resolve()) if main else ""
            self.run_dir = Path(distributed.share(made, run.device))
        self.weights_dir = self.run_dir / "weights"
        self._improved = False
        self.checkpoints = CheckpointWriter()  # last.pt and best.pt, written in the background
        self._copies: dict[str, Any] | None = None  # the epoch's tensors, copied (_copy_tensors)
        # the next epoch's first batch, or what fetching it raised (_fetch_ahead)
        self._ahead: tuple[torch.Tensor, Targets] | Exception | None = None
        self._log_reads = LaggedReads()
        # multi_scale: each batch's size, from the seed, the epoch and the batch's index
        self._sizes = size_draw(cfg.multi_scale, cfg.imgsz, cfg.seed)
        self._weights_were_finite = True  # the last epoch's, read with its last log read
        self.state = RunState(
            run_dir=self.run_dir,
            config=cfg,
            model=run.spec.model,
            device=run.device,
            precision=run.precision.name,
            graph=run.graph,
            accumulate=run.accumulate,
            batches_per_epoch=run.train_loader.batch_sampler.batches_per_epoch,
            train_images=len(run.train_loader.dataset),
            progress=run.progress,
            phases=run.phases,
            installed=Installed(
                frozenset(plugins.graph_backends.names(with_aliases=True)),
                frozenset(plugins.precision_backends.names(with_aliases=True)),
                tuple(plugins.levers),
                frozenset(r.distribution for r in plugins.records if r.status == "ok"),
            ),
            world_size=run.world.size,
            rank=run.world.rank,
            _stats=run.step.stats,
            _stop=self.request_stop,
        )
        if main:
            (self.run_dir / "args.yaml").write_text(
                yaml.safe_dump(cfg.model_dump(), sort_keys=False)
            )
        pairs = " ".join(f"{k}={format_value(v)}" for k, v in cfg.model_dump().items())
        log.info("keys: %s", textwrap.fill(pairs, 100, subsequent_indent="      "))
        log.info("%s", describe(run, self.run_dir))
        if self._sizes is not None:
            log.info(
                "multi_scale=%s: each batch trains at one of %s px, drawn from the seed "
                "(one recording per size for a graph backend); validation at %d px",
                cfg.multi_scale,
                ", ".join(map(str, self._sizes.sizes)),
                cfg.imgsz,
            )

    # ----------------------------------------------------------------------------- the loop
    def fit(self) -> dict[str, Any]:
        """Train to ``epochs`` (or an early stop); returns the final metrics and paths."""
        run, cfg = self.run, self.cfg
        run.train_loader.batch_sampler.set_epochs(self.progress.epoch, cfg.epochs)
        with collector.frozen():  # collections walk what training makes, not the start-up's
            return self._fit()

    def _fit(self) -> dict[str, Any]:
        """The epochs, their saves and the workers' end (:meth:`fit`)."""
        run, cfg = self.run, self.cfg
        self._batches = iter(run.train_loader)
        try:
            self.callbacks.fire("on_train_start", self.state)
            for epoch in range(self.progress.epoch, cfg.epochs):
                self.progress.epoch = epoch
                row = self._train_epoch()
                if row is None:  # request_stop inside the epoch: nothing of it is saved
                    break
                row.update(self._validate_if_due())
                self.progress.epoch = epoch + 1
                self.callbacks.fire("on_epoch_end", self.state, row)
                if run.world.main:
                    self._save()
                if distributed.any_rank(bool(self.stop_reason), run.device):
                    self.stop_reason = self.stop_reason or "rank 0 stopped the run"
                    break
            self.checkpoints.wait()  # on disk before anything reads them
            if self.stop_reason:
                log.info("%s", self.stop_reason)
            self.callbacks.fire("on_train_end", self.state)
            ended_well = True
        except BaseException as exc:
            ended_well = False
            self.checkpoints.close()  # the last epoch's files still land; exc is the error
            self.callbacks.fire("on_exception", self.state, exc)
            raise
        finally:
            self._batches = self._ahead = None  # what was prepared beyond the run is dropped
            self._val_batches = None
            for loader in (run.train_loader, run.val_loader):
                if loader is not None:
                    stop_workers(loader)  # now, not at interpreter exit (stop_workers)
            distributed.stop(together=ended_well)
        return self.summary()

    def request_stop(self, reason: str) -> None:
        """End the run after the current batch (:meth:`RunState.request_stop`)."""
        self.stop_reason = reason
        self._stop_after_batch = True

    def _train_epoch(self) -> dict[str, Any] | None:
        """One epoch of training; its results.csv row, or ``None`` when :meth:`request_stop`
        ended it early."""
        run, cfg, state = self.run, self.cfg, self.state
        step = run.step
        batches_per_epoch = state.batches_per_epoch
        run.model.train()
        if self._validation_due():
            # the val loader's workers prepare their batches while this epoch trains, instead
            # of after its last step (validation waited on them)
            self._val_batches = iter(run.val_loader)
        self.callbacks.fire("on_epoch_start", state)
        sums = good = bad_run = worst = None
        names: list[str] = []
        start, images_seen = time.perf_counter(), 0
        self._log_reads.reset()
        batches = self._batches  # fit()'s iterator: the next batch is this epoch's first
        release_at = write_release_batch(batches_per_epoch)
        for i in range(batches_per_epoch):
            ahead, self._ahead = self._ahead, None
            if isinstance(ahead, Exception):
                raise ahead  # where it was raised before the fetch moved ahead (_fetch_ahead)
            images, targets = ahead or self._fetch(batches, self.progress.epoch, i)
            update = (i + 1) % run.accumulate == 0 or i + 1 == batches_per_epoch
            loss, parts = step(images, targets, update=update)
            # bookkeeping on the device: sums of finite losses and the non-finite run length
            names = names or list(parts)
            finite = torch.isfinite(loss)
            values = torch.where(finite, torch.stack([parts[k] for k in names]), 0.0)
            if sums is None:
                sums, good = values, finite.long()
                bad_run = worst = (~finite).long()
            else:
                sums, good = sums + values, good + finite.long()
                bad_run = (bad_run + 1) * (~finite).long()
                worst = torch.maximum(worst, bad_run)
            # every rank trains an equal share of the epoch (the distributed sampler's), so
            # img/s counts all ranks' images, not rank 0's alone
            images_seen += len(images) * run.world.size
            state.batch_in_epoch = i + 1
            if i + 1 == release_at:
                self.checkpoints.release()  # the previous epoch's files serialise from here
            last = i + 1 == batches_per_epoch
            weights_finite = None
            if last:  # queued before the log read's wait for the GPU, read by it
                self._copy_tensors()
                weights_finite = self._weights_finite()
                if self.progress.epoch + 1 < cfg.epochs and not run.phases.timed:
                    self._fetch_ahead(batches)
            if (i + 1) % cfg.log_interval == 0 or last:
                self._read_log(
                    names, sums, good, worst, images_seen, start, now=last, also=weights_finite
                )
            self.callbacks.fire("on_step_end", state)
            # in a distributed run a stop takes effect at the epoch's end, where every rank
            # learns of it (any_rank in fit): one rank leaving mid-epoch would strand the rest
            partial = self._stop_after_batch and i + 1 < batches_per_epoch
            if partial and not run.world.distributed:
                return None
        self._refuse_non_finite_weights()
        seconds = time.perf_counter() - start
        row: dict[str, Any] = {"epoch": self.progress.epoch + 1}
        row.update({f"train/{k}": v for k, v in state.logged.items() if k in names})
        row["lr"] = run.optimizer.param_groups[0]["lr"]
        row["epoch_time"] = round(seconds, 3)
        row["img/s"] = round(images_seen / seconds, 1)
        return row

    def _fetch(
        self, batches: Iterator[dict[str, Any]], epoch: int, index: int
    ) -> tuple[torch.Tensor, Targets]:
        """The next batch of ``batches`` (batch ``index`` of ``epoch``), on the device: its
        images as floats in [0, 1] and its targets, their copies queued; with ``multi_scale``
        both resized to the batch's drawn size (:mod:`falconet.training.multi_scale`)."""
        run = self.run
        with run.phases("data"):
            batch = next(batches)
        with run.phases("to-device"):
            # uint8 to float32 in [0, 1] in one kernel (.float().div_() is two passes)
            images = batch["images"].to(run.device, non_blocking=True).div(255)
            targets = Targets.from_batch(batch).to(run.device, non_blocking=True)
            if self._sizes is not None:
                images, targets = rescale(images, targets, self._sizes(epoch, index))
        return images, targets

    def _fetch_ahead(self, batches: Iterator[dict[str, Any]]) -> None:
        """The next epoch's first batch into ``_ahead`` (:meth:`_fetch`), at an epoch's last
        batch, before its log read: that read waits for the GPU, which then idles until the
        host launches the next step, and the loader's hand-over and the copies are then
        already done. Nothing of the run changes by it: a batch is its epoch's and index's
        whenever it is fetched, and a run that stops there drops it. While a profiler times
        the phases (:class:`~falconet.training.phases.Phases`) the loop does not call this, so
        the phases recorded for a batch are that batch's. What fetching raised is kept in
        ``_ahead`` and raised when the next epoch asks for the batch: a loader that fails
        there (a worker killed, say) must not cost this epoch its checkpoint."""
        try:
            self._ahead = self._fetch(batches, self.progress.epoch + 1, 0)
        except Exception as exc:
            self._ahead = exc

    def _read_log(
        self, names, sums, good, worst, images_seen, start, *, now: bool, also=None
    ) -> None:
        """The host read of a log interval: mean losses so far and the non-finite count; mid
        epoch (not ``now``) those of the previous interval, read without waiting for the GPU
        (:class:`~falconet.training.log_reads.LaggedReads`), so the losses shown and the
        ``nan_patience`` check lag by one ``log_interval``; the epoch's last read is exact.
        ``also`` (a device scalar, the epoch's last read: :meth:`_weights_finite`) is read in
        the same transfer and kept in ``_weights_were_finite``."""
        extra = [good[None].to(sums.dtype), worst[None].to(sums.dtype)]
        if also is not None:
            extra.append(also[None].to(sums.dtype))
        host = self._log_reads.read(torch.cat([sums, *extra]), now=now)
        if host is None:  # the epoch's first interval: nothing read yet
            return
        if also is not None:
            self._weights_were_finite = bool(host.pop())
        count, worst_run = host[-2], int(host[-1])
        if worst_run >= self.cfg.nan_patience:
            raise TrainingDiverged(
                f"the loss was NaN or infinite for {worst_run} consecutive steps in epoch "
                f"{self.progress.epoch + 1} (nan_patience={self.cfg.nan_patience}); stopped. "
                f"The last good checkpoint is {self.weights_dir / 'last.pt'}. Try a lower lr0, "
                "amp_dtype=fp32, or check the data with `falconet data check`"
            )
        logged = {k: v / max(count, 1) for k, v in zip(names, host, strict=False)}
        logged["img/s"] = round(images_seen / (time.perf_counter() - start), 1)
        device = self.run.device
        if device.type == "cuda":
            logged["gpu_mem"] = f"{torch.cuda.max_memory_reserved(device) / 2**30:.1f}G"
        self.state.logged = logged

    def _weights_finite(self) -> torch.Tensor:
        """Whether every weight is finite, as a device scalar (no wait): each tensor's largest
        magnitude (NaN where it holds one) in a few foreach kernels. Queued at the epoch's
        last batch and read with its last log read: the GPU's queue is drained once at an
        epoch's end, not twice, and the host has less to do once it is empty (the GPU waits
        for the host from that read to the next epoch's first launch)."""
        params = [p.detach() for p in self.run.model.parameters()]
        largest = [n.float() for n in torch._foreach_norm(params, math.inf)]
        return torch.isfinite(torch.stack(largest).sum())

    def _refuse_non_finite_weights(self) -> None:
        if not self._weights_were_finite:
            raise TrainingDiverged(
                f"the weights became NaN or infinite in epoch {self.progress.epoch + 1}; "
                f"stopped without saving them. The last good checkpoint is "
                f"{self.weights_dir / 'last.pt'}. Try a lower lr0, amp_dtype=fp32, or a "
                "smaller clip_grad"
            )

    # ------------------------------------------------------------------------- validation
    def _validation_due(self) -> bool:
        """Whether the current epoch ends with a validation (every ``val_interval`` and the
        last)."""
        epoch, cfg = self.progress.epoch, self.cfg
        last = epoch + 1 == cfg.epochs
        return self.run.val_loader is not None and ((epoch + 1) % cfg.val_interval == 0 or last)

    def _validate_if_due(self) -> dict[str, Any]:
        cfg = self.cfg
        if not self._validation_due():
            return dict.fromkeys(METRIC_COLUMNS, "")  # every row has the same columns
        result = self.validate()
        if result is None:  # a rank other than 0: rank 0 scores and decides
            return dict.fromkeys(METRIC_COLUMNS, "")
        score = validation.fitness(result, cfg.metric)
        if score > self.best + cfg.min_delta:
            self.best, self.best_epoch, self.bad_validations = score, self.progress.epoch + 1, 0
            self.best_eval = result
            self._improved = True
        else:
            self.bad_validations += 1
            self._improved = False
            if cfg.patience and self.bad_validations >= cfg.patience:
                self.stop_reason = (
                    f"early stop: {cfg.metric} has not improved by more than {cfg.min_delta} "
                    f"for {self.bad_validations} validations (patience={cfg.patience}); best "
                    f"{self.best:.4f} at epoch {self.best_epoch}"
                )
        log.info(
            "val: %s %.4f, best %.4f at epoch %d; %d of patience %s validations without a gain "
            "over %s",
            cfg.metric,
            score,
            self.best,
            self.best_epoch,
            self.bad_validations,
            cfg.patience or "off (0)",
            cfg.min_delta,
        )
        values = (result.stats["AP"], result.stats["AP50"], result.stats["AR100"], score)
        return {k: round(v, 5) for k, v in zip(METRIC_COLUMNS, values, strict=True)}

    def validate(self) -> EvalResult | None:
        """Evaluate the weights of ``val_weights`` (:meth:`_weights_module`) on the val split
        (in a distributed run each rank predicts its share and rank 0 scores them: ``None``
        elsewhere)."""
        run, cfg = self.run, self.cfg
        module = self._weights_module()
        module.eval()
        batches, self._val_batches = self._val_batches, None  # started with the epoch, if due
        result = validation.score_split(
            module,
            run.family,
            run.val_loader if batches is None else batches,
            run.dataset,
            run.device,
            cfg,
            self.plugins,
            autocast=run.precision.autocast(run.device),
        )
        run.model.train()
        if result is not None:
            self.state.last_eval = result
            self.callbacks.fire("on_val_end", self.state, result)
        return result

    # ------------------------------------------------------------------------ checkpoints
    def _weights_module(self) -> torch.nn.Module:
        """What validation and ``best.pt`` use (``val_weights``): the EMA's weights where the
        run keeps an EMA and ``val_weights=ema``, else the model's."""
        if self.run.ema is not None and self.cfg.val_weights == "ema":
            return self.run.ema.module
        return self.run.model

    def _save(self) -> None:
        """``last.pt`` every epoch (full state); ``best.pt`` when the metric improved. The
        tensors were copied to host memory at the epoch's last batch (:meth:`_copy_tensors`)
        and the files are written while the next epoch trains, from its middle at the latest
        (:func:`write_release_batch`);
        :meth:`fit` waits for them before ``on_train_end``."""
        copies, self._copies = self._copies, None  # every saved epoch reached its last batch
        self.checkpoints.hold()  # released by the next epoch once under way (_train_epoch)
        self.checkpoints.write(self._checkpoint_files(copies))
        self._improved = False

    def _copy_tensors(self) -> None:
        """Queue the host copies of this epoch's checkpoint tensors, at its last batch: the
        weights and the optimizer are final once the last step is queued, and copied now the
        copies' host work overlaps the GPU's last steps instead of leaving it idle at the
        epoch's end (the log read after this batch waits for the GPU). Discarded if the run
        stops before :meth:`_save` (non-finite weights, an exception)."""
        if self.run.world.main:
            self._copies = self.checkpoints.copy([self._checkpoint_tensors()])[0]

    def _checkpoint_tensors(self) -> dict[str, Any]:
        """The checkpoint's tensors, by section (live tensors, not copies): ``weights`` (what
        ``best.pt`` holds: the EMA's, else the model's), ``model``, ``ema`` and ``optimizer``."""
        run = self.run
        return {
            "weights": self._weights_module().state_dict(),
            "model": run.model.state_dict(),
            "ema": (
                {"state": run.ema.module.state_dict(), "updates": run.ema.updates}
                if run.ema is not None
                else None
            ),
            "optimizer": run.optimizer.state_dict(),
        }

    def _checkpoint_files(
        self, tensors: dict[str, Any] | None = None
    ) -> list[tuple[dict[str, Any], Path]]:
        """The states to save at this epoch's end and their files: ``tensors``
        (:meth:`_checkpoint_tensors`' sections, copied or live; the live ones by default) and
        the run's counters, metrics, scaler and random states as they are now."""
        run = self.run
        tensors = self._checkpoint_tensors() if tensors is None else tensors
        weights = {
            "format": FORMAT,
            "spec": run.spec.to_dict(),
            "weights": tensors["weights"],
            "config": self.cfg.model_dump(),
            "epoch": self.progress.epoch,
            "metrics": {
                "best": self.best,
                "best_epoch": self.best_epoch,
                **saved_eval(self.best_eval),
            },
            "versions": self._versions(),
        }
        state = {
            **weights,
            "model": tensors["model"],
            "ema": tensors["ema"],
            "optimizer": tensors["optimizer"],
            "scaler": run.scaler.state_dict() if run.scaler else None,  # reads the scale
            "step": self.progress.updates,
            "world_size": run.world.size,
            "bad_validations": self.bad_validations,
            "rng": rng_states(),
        }
        files = [(state, self.weights_dir / "last.pt")]
        if self._improved or run.val_loader is None:
            files.append((weights, self.weights_dir / "best.pt"))
        return files

    def _restore(self, state: dict[str, Any]) -> None:
        run = self.run
        saved = state.get("world_size", 1)
        if saved != run.world.size:
            raise ConfigError(
                f"resume: {self.run_dir} was trained by {saved} process(es) and this run has "
                f"{run.world.size}; each rank's share of the batches and the saved random "
                f"states depend on it, so resume with the same world size ({saved})"
            )
        run.model.load_state_dict(state["model"])
        if run.ema is not None:
            run.ema.module.load_state_dict(state["ema"]["state"])
            run.ema.updates = state["ema"]["updates"]
        run.optimizer.load_state_dict(state["optimizer"])
        if run.scaler and state["scaler"]:
            run.scaler.load_state_dict(state["scaler"])
        self.progress.epoch, self.progress.updates = state["epoch"], state["step"]
        self.best, self.best_epoch = state["metrics"]["best"], state["metrics"]["best_epoch"]
        self.best_eval = restored_eval(state["metrics"])
        self.bad_validations = state["bad_validations"]
        restore_rng_states(state["rng"])
        log.info("resuming %s from the end of epoch %d", self.run_dir, self.progress.epoch)

    def _versions(self) -> dict[str, str]:
        versions = {"falconet": __version__, "torch": str(torch.__version__)}
        for record in self.plugins.records:
            versions.setdefault(record.distribution, record.version)
        return versions

    def summary(self) -> dict[str, Any]:
        best = self.best_eval
        return {
            "run_dir": str(self.run_dir),
            "epochs": self.progress.epoch,
            "best_epoch": self.best_epoch,
            "best_fitness": self.best,
            "metrics": dict(best.stats) if best else {},
            "per_class_ap": dict(best.per_class_ap) if best else {},
            "per_class_ap50": dict(best.per_class_ap50) if best else {},
            "graph": self.run.graph,
            "precision": self.run.precision.name,
            "stop_reason": self.stop_reason,
        }


def saved_eval(best: EvalResult | None) -> dict[str, Any]:
    """The best validation's numbers as plain values for a checkpoint's ``metrics``, so a
    resumed run that never beats them still ends with their table (:func:`restored_eval`)."""
    if best is None:
        return {}
    return {
        "best_eval": {
            "stats": {k: float(v) for k, v in best.stats.items()},
            "per_class_ap": {k: float(v) for k, v in best.per_class_ap.items()},
            "per_class_ap50": {k: float(v) for k, v in best.per_class_ap50.items()},
            "backend": best.backend,
            "backend_version": best.backend_version,
        }
    }


def restored_eval(metrics: dict[str, Any]) -> EvalResult | None:
    """The best validation saved in a checkpoint's ``metrics`` (``None`` in one from before
    it was saved, or from a run that had not validated)."""
    saved = metrics.get("best_eval")
    if saved is None:
        return None
    return EvalResult(
        saved["stats"],
        saved["per_class_ap"],
        saved["per_class_ap50"],
        saved["backend"],
        saved["backend_version"],
    )
