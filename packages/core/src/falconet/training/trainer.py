"""The training loop: one loop for every family, precision and graph backend.

A step runs in the phases of the design: fetch batch, host-to-device, network (through the
graph backend, under the precision backend's autocast), loss (assign + criterion), backward,
optimizer (unscale, clip, step), EMA, each inside ``self.phases(name)`` (the profiler's seam,
:mod:`falconet.training.phases`). Nothing in a step reads a device value back to the host;
losses and the non-finite counter are summed on the device and read every ``log_interval``
batches and at the end of an epoch.

Gradients accumulate over ``accumulate = round(nbs / batch)`` batches; the loss, a per-image
mean, is multiplied by ``batch`` before backward, so a step's gradient sums over the nominal
batch as the YOLO recipes' ``lr0`` assumes, whatever ``batch`` and the world size. An epoch
ends with an optimizer step, so an epoch boundary holds no pending gradient: checkpoints are
written there and ``resume`` continues from the last one exactly.
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
from falconet.data.records import DataError
from falconet.data.resolve import load_dataset
from falconet.data.targets import TARGET_KEYS
from falconet.evaluation.contract import EvalResult
from falconet.interfaces import DispatchContext
from falconet.plugins import Plugins
from falconet.training import validation
from falconet.training.callbacks import CallbackList
from falconet.training.checkpoint import (
    FORMAT,
    CheckpointWriter,
    load_matching_weights,
    restore_rng_states,
    rng_states,
)
from falconet.training.components import (
    choose_dispatch,
    choose_precision,
    configure_determinism,
    new_run_dir,
    resolve_device,
)
from falconet.training.config import format_value
from falconet.training.optimization import ModelEMA, Schedule, build_optimizer
from falconet.training.phases import NO_PHASES
from falconet.training.setup import ModelSpec, Plan, build_loaders

log = logging.getLogger("falconet.train")

METRIC_COLUMNS = ("metrics/mAP50-95", "metrics/mAP50", "fitness")


class TrainingDiverged(RuntimeError):
    """The loss stayed non-finite; the last good checkpoint is kept."""


class Trainer:
    """A training run composed from registered parts; :meth:`fit` runs it."""

    def __init__(self, plan: Plan, plugins: Plugins, callbacks: Iterable[Any] = ()) -> None:
        cfg = self.cfg = plan.config
        self.plugins = plugins
        self.device = resolve_device(cfg.device)
        configure_determinism(cfg.seed, cfg.deterministic, self.device)
        self.dataset = load_dataset(cfg.data, splits=("train", "val") if cfg.val else ("train",))
        self.dataset.require_usable()
        if cfg.val and "val" not in self.dataset.splits:
            raise DataError(f"data={cfg.data}: has no val split; add `val:` or pass val=false")
        for split in self.dataset.splits.values():
            (log.warning if split.problems else log.info)("data %s", split.summary())
        self.family = plan.family
        self.spec = ModelSpec(plan.family.name, plan.model_name, tuple(self.dataset.names))
        model = self.family.build_model(plan.model_name, len(self.dataset.names))
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
        self.precision = choose_precision(cfg.amp_dtype, self.device, plugins)
        model = self.precision.wrap_model(model)
        self.model = model.to(self.device, memory_format=torch.channels_last)
        self.loss_fn = self.family.build_loss(self.model, plugins.assigners.get(cfg.assigner))
        self.train_loader, self.val_loader = build_loaders(cfg, self.dataset, self.device)
        self.steps_in_epoch = self.train_loader.batch_sampler.batches_per_epoch
        self._batches: Iterator[dict[str, Any]] | None = None  # one iterator over all epochs
        self._val_batches: Iterator[dict[str, Any]] | None = None  # started with the epoch
        self.accumulate = max(round(cfg.nbs / cfg.batch), 1)
        self.optimizer = build_optimizer(self.model, cfg, self.accumulate)
        self.schedule = Schedule(cfg, math.ceil(self.steps_in_epoch / self.accumulate))
        self.scaler = self.precision.grad_scaler(self.device)
        self.ema = ModelEMA(self.model, cfg.ema_decay, cfg.ema_tau) if cfg.ema else None
        static_loss = getattr(self.family, "static_loss", None)
        context = DispatchContext(
            self.device,
            self.precision.name,
            capture_region=self.family.capture_region(self.model),
            options=cfg.model_dump(),
            static_loss=bool(static_loss and static_loss(cfg.assigner)),
        )
        self.graph, self.network = choose_dispatch(cfg.graph, context, self.model, plugins)
        wrap_step = getattr(plugins.graph_backends.get(self.graph), "wrap_step", None)
        self.step_runner = wrap_step(self) if wrap_step is not None else None
        if cfg.fuse != "none" and self.step_runner is None:
            log.warning(
                "fuse=%s applies inside graph=whole-step's captured step; this run uses "
                "graph=%s, so it is ignored (graph=compile compiles an eager step)",
                cfg.fuse,
                self.graph,
            )
        self.epoch = self.step = self.bad_validations = 0
        self.best, self.best_epoch = -math.inf, 0
        self.batch_in_epoch, self.logged = 0, {}
        self.last_eval: EvalResult | None = None
        self.best_eval: EvalResult | None = None
        self.stop_reason = ""
        self._stop_after_batch = False  # request_stop: end the run after the current batch
        self.callbacks = CallbackList(callbacks)
        self.phases = NO_PHASES  # a profiler swaps in a timer for its window (phases.py)
        if plan.resume_state is not None:
            self.run_dir = plan.resume_path.resolve().parent.parent
            self._restore(plan.resume_state)
        else:
            self.run_dir = new_run_dir(cfg.project, cfg.name, cfg.exist_ok).resolve()
        self.weights_dir = self.run_dir / "weights"
        self._improved = False
        self.checkpoints = CheckpointWriter()  # last.pt and best.pt, written in the background
        (self.run_dir / "args.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
        pairs = " ".join(f"{k}={format_value(v)}" for k, v in cfg.model_dump().items())
        log.info("keys: %s", textwrap.fill(pairs, 100, subsequent_indent="      "))
        log.info(
            "run %s: %s on %s, %s, graph=%s, %d train / %s val images, accumulate %d",
            self.run_dir,
            plan.model_name,
            self.device,
            self.precision.name,
            self.graph,
            len(self.train_loader.dataset),
            len(self.val_loader.dataset) if self.val_loader else "no",
            self.accumulate,
        )

    # ----------------------------------------------------------------------------- the loop
    def fit(self) -> dict[str, Any]:
        """Train to ``epochs`` (or an early stop); returns the final metrics and paths."""
        self.train_loader.batch_sampler.set_epochs(self.epoch, self.cfg.epochs)
        self._batches = iter(self.train_loader)
        try:
            self.callbacks.fire("on_train_start", self)
            for epoch in range(self.epoch, self.cfg.epochs):
                self.epoch = epoch
                row = self._train_epoch()
                if row is None:  # request_stop inside the epoch: nothing of it is saved
                    break
                row.update(self._validate_if_due())
                self.epoch = epoch + 1
                self.callbacks.fire("on_epoch_end", self, row)
                self._save()
                if self.stop_reason:
                    break
            self.checkpoints.wait()  # on disk before anything reads them
            if self.stop_reason:
                log.info("%s", self.stop_reason)
            self.callbacks.fire("on_train_end", self)
        except BaseException as exc:
            self.checkpoints.close()  # the last epoch's files still land; exc is the error
            self.callbacks.fire("on_exception", self, exc)
            raise
        finally:
            self._batches = None  # what the workers prepared beyond the last epoch is dropped
            self._val_batches = None
            for loader in (self.train_loader, self.val_loader):
                if loader is not None:
                    stop_workers(loader)  # now, not 5 s per worker at exit (stop_workers)
        return self.summary()

    def request_stop(self, reason: str) -> None:
        """End the run after the current batch (a callback calls it from ``on_step_end``).

        Inside an epoch, the partial epoch is neither validated nor saved, so no checkpoint
        claims an epoch that did not finish; after an epoch's last batch the epoch ends as
        usual. ``reason`` is logged and returned in the summary as ``stop_reason``.
        """
        self.stop_reason = reason
        self._stop_after_batch = True

    def _train_epoch(self) -> dict[str, Any] | None:
        """One epoch of training; its results.csv row, or ``None`` when :meth:`request_stop`
        ended it early."""
        cfg, device = self.cfg, self.device
        self.model.train()
        if self._validation_due():
            # the val loader's workers prepare their batches while this epoch trains, instead
            # of after its last step (validation waited on them: docs/performance.md)
            self._val_batches = iter(self.val_loader)
        self.callbacks.fire("on_epoch_start", self)
        sums = good = bad_run = worst = None
        names: list[str] = []
        start, images_seen = time.perf_counter(), 0
        batches = self._batches  # fit()'s iterator: the next batch is this epoch's first
        for i in range(self.steps_in_epoch):
            with self.phases("data"):
                batch = next(batches)
            with self.phases("to-device"):
                images = batch["images"].to(device, non_blocking=True).float().div_(255)
                targets = {k: batch[k].to(device, non_blocking=True) for k in TARGET_KEYS}
            step_now = (i + 1) % self.accumulate == 0 or i + 1 == self.steps_in_epoch
            loss, parts = self.train_batch(images, targets, optimizer_step=step_now)
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
            images_seen += len(images)
            self.batch_in_epoch = i + 1
            if (i + 1) % cfg.log_interval == 0 or i + 1 == self.steps_in_epoch:
                self._read_log(names, sums, good, worst, images_seen, start)
            self.callbacks.fire("on_step_end", self)
            if self._stop_after_batch and i + 1 < self.steps_in_epoch:
                return None
        self._check_weights_finite()
        seconds = time.perf_counter() - start
        row: dict[str, Any] = {"epoch": self.epoch + 1}
        row.update({f"train/{k}": v for k, v in self.logged.items() if k in names})
        row["lr"] = self.optimizer.param_groups[0]["lr"]
        row["epoch_time"] = round(seconds, 3)
        row["img/s"] = round(images_seen / seconds, 1)
        return row

    def train_batch(
        self, images: torch.Tensor, targets: dict[str, torch.Tensor], *, optimizer_step: bool
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Forward, loss and backward of one batch on the device; then, if ``optimizer_step``,
        the optimizer step and EMA update. Returns the loss and its parts (device tensors).

        A backend's step runner (``graph=whole-step``) does all of it where it can."""
        scheduled = False
        if self.step_runner is not None:
            if optimizer_step:
                self.schedule.apply(self.optimizer, self.step, self.epoch)
                scheduled = True
            with self.phases("step"):
                done = self.step_runner(images, targets, optimizer_step=optimizer_step)
            if done is not None:
                self.step += optimizer_step
                return done
        with self.phases("forward"), self.precision.autocast(self.device):
            outputs = self.network(images)
        with self.phases("loss"):
            loss, parts = self.loss_fn(outputs, targets)
        with self.phases("backward"):
            scaled = loss * self.cfg.batch
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        if optimizer_step:
            self._optimizer_step(scheduled=scheduled)
        return loss, parts

    def _optimizer_step(self, *, scheduled: bool = False) -> None:
        """Clip, step, zero and EMA; ``scheduled``: this step's learning rates and momenta
        are already set (the step runner's path did it before it fell back to eager)."""
        with self.phases("optimizer"):
            if not scheduled:
                self.schedule.apply(self.optimizer, self.step, self.epoch)
            if self.scaler:
                self.scaler.unscale_(self.optimizer)
            if self.cfg.clip_grad > 0:
                torch.nn.utils.clip_grad_norm_(
                    self.model.parameters(), self.cfg.clip_grad, foreach=True
                )
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
        with self.phases("ema"):
            if self.ema is not None:
                self.ema.update(self.model)

    def _read_log(self, names, sums, good, worst, images_seen, start) -> None:
        """The one host read of a log interval: mean losses so far and the non-finite count."""
        host = torch.cat([sums, good[None].to(sums.dtype), worst[None].to(sums.dtype)]).tolist()
        count, worst_run = host[-2], int(host[-1])
        if worst_run >= self.cfg.nan_patience:
            raise TrainingDiverged(
                f"the loss was NaN or infinite for {worst_run} consecutive steps in epoch "
                f"{self.epoch + 1} (nan_patience={self.cfg.nan_patience}); stopped. The last "
                f"good checkpoint is {self.run_dir / 'weights' / 'last.pt'}. Try a lower lr0, "
                "amp_dtype=fp32, or check the data with `falconet data check`"
            )
        self.logged = {k: v / max(count, 1) for k, v in zip(names, host, strict=False)}
        self.logged["img/s"] = round(images_seen / (time.perf_counter() - start), 1)
        if self.device.type == "cuda":
            self.logged["gpu_mem"] = f"{torch.cuda.max_memory_reserved(self.device) / 2**30:.1f}G"

    def _check_weights_finite(self) -> None:
        flat = torch.stack([p.detach().float().abs().sum() for p in self.model.parameters()])
        if not torch.isfinite(flat.sum()):
            raise TrainingDiverged(
                f"the weights became NaN or infinite in epoch {self.epoch + 1}; stopped without "
                f"saving them. The last good checkpoint is {self.weights_dir / 'last.pt'}. Try a "
                "lower lr0, amp_dtype=fp32, or a smaller clip_grad"
            )

    # ------------------------------------------------------------------------- validation
    def _validation_due(self) -> bool:
        """Whether the current epoch ends with a validation (every ``val_interval`` and the
        last)."""
        last = self.epoch + 1 == self.cfg.epochs
        return self.val_loader is not None and (
            (self.epoch + 1) % self.cfg.val_interval == 0 or last
        )

    def _validate_if_due(self) -> dict[str, Any]:
        cfg = self.cfg
        if not self._validation_due():
            return dict.fromkeys(METRIC_COLUMNS, "")  # every row has the same columns
        result = self.validate()
        score = validation.fitness(result, cfg.metric)
        if score > self.best + cfg.min_delta:
            self.best, self.best_epoch, self.bad_validations = score, self.epoch + 1, 0
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
        values = (result.stats["AP"], result.stats["AP50"], score)
        return {k: round(v, 5) for k, v in zip(METRIC_COLUMNS, values, strict=True)}

    def validate(self) -> EvalResult:
        """Evaluate the EMA weights (the model's, without EMA) on the val split."""
        module = self.ema.module if self.ema is not None else self.model
        module.eval()
        batches, self._val_batches = self._val_batches, None  # started with the epoch, if due
        accumulator = validation.predict_split(
            module,
            self.family,
            self.val_loader if batches is None else batches,
            self.device,
            validation.category_ids(self.dataset),
            autocast=self.precision.autocast(self.device),
            conf=self.cfg.conf,
            iou=self.cfg.iou,
            max_det=self.cfg.max_det,
        )
        truth = validation.ground_truth(self.dataset, self.dataset.splits["val"])
        result = validation.evaluate_split(
            accumulator, truth, backend=self.cfg.eval_backend, plugins=self.plugins
        )
        self.model.train()
        self.last_eval = result
        self.callbacks.fire("on_val_end", self, result)
        return result

    # ------------------------------------------------------------------------ checkpoints
    def _weights_state(self) -> dict[str, Any]:
        module = self.ema.module if self.ema is not None else self.model
        return {
            "format": FORMAT,
            "spec": self.spec.to_dict(),
            "weights": module.state_dict(),
            "config": self.cfg.model_dump(),
            "epoch": self.epoch,
            "metrics": {"best": self.best, "best_epoch": self.best_epoch},
            "versions": self._versions(),
        }

    def _save(self) -> None:
        """``last.pt`` every epoch (full state); ``best.pt`` when the metric improved. Both are
        snapshotted to host memory here and written while the next epoch trains
        (:class:`CheckpointWriter`); :meth:`fit` waits for them before ``on_train_end``."""
        self.checkpoints.submit(self._checkpoint_files())
        self._improved = False

    def _checkpoint_files(self) -> list[tuple[dict[str, Any], Path]]:
        """The states to save at this epoch's end and their files (live tensors, not copies)."""
        state = self._weights_state()
        state.update(
            {
                "model": self.model.state_dict(),
                "ema": (
                    {"state": self.ema.module.state_dict(), "updates": self.ema.updates}
                    if self.ema is not None
                    else None
                ),
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler else None,
                "step": self.step,
                "bad_validations": self.bad_validations,
                "rng": rng_states(),
            }
        )
        files = [(state, self.weights_dir / "last.pt")]
        if self._improved or self.val_loader is None:
            files.append((self._weights_state(), self.weights_dir / "best.pt"))
        return files

    def _restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if self.ema is not None:
            self.ema.module.load_state_dict(state["ema"]["state"])
            self.ema.updates = state["ema"]["updates"]
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.step = state["epoch"], state["step"]
        self.best, self.best_epoch = state["metrics"]["best"], state["metrics"]["best_epoch"]
        self.bad_validations = state["bad_validations"]
        restore_rng_states(state["rng"])
        log.info("resuming %s from the end of epoch %d", self.run_dir, self.epoch)

    def _versions(self) -> dict[str, str]:
        versions = {"falconet": __version__, "torch": str(torch.__version__)}
        for record in self.plugins.records:
            versions.setdefault(record.distribution, record.version)
        return versions

    def summary(self) -> dict[str, Any]:
        best = self.best_eval
        return {
            "run_dir": str(self.run_dir),
            "epochs": self.epoch,
            "best_epoch": self.best_epoch,
            "best_fitness": self.best,
            "metrics": dict(best.stats) if best else {},
            "per_class_ap": dict(best.per_class_ap) if best else {},
            "per_class_ap50": dict(best.per_class_ap50) if best else {},
            "graph": self.graph,
            "precision": self.precision.name,
            "stop_reason": self.stop_reason,
        }
