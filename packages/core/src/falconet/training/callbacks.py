"""Callbacks: the observers of a run, and the core's own (CSV log, console progress, plots,
TensorBoard).

The trainer fires ``on_train_start``, ``on_epoch_start``, ``on_step_end`` (after each batch,
whether or not it stepped the optimizer), ``on_val_end(result)``, ``on_epoch_end(row)`` (the
epoch's ``results.csv`` row), ``on_train_end`` and ``on_exception(exc)``, each with the
trainer first. Loggers are callbacks like any plugin's; none of them reads device tensors
per step (the trainer hands them host numbers at its log interval).
"""

from __future__ import annotations

import csv
import logging
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from falconet.training.trainer import Trainer

log = logging.getLogger("falconet.train")

EVENTS = (
    "on_train_start",
    "on_epoch_start",
    "on_step_end",
    "on_val_end",
    "on_epoch_end",
    "on_train_end",
    "on_exception",
)


class CallbackList:
    """Fire an event on every callback that defines it, in order."""

    def __init__(self, callbacks: Iterable[Any] = ()) -> None:
        self.callbacks = list(callbacks)

    def fire(self, event: str, trainer: Trainer, *args: Any) -> None:
        for callback in self.callbacks:
            method = getattr(callback, event, None)
            if method is not None:
                method(trainer, *args)


class CSVLogger:
    """``results.csv``: one row per epoch; on resume, rows of epochs to be redone are dropped."""

    name = "csv"

    def on_train_start(self, trainer: Trainer) -> None:
        self.path = trainer.run_dir / "results.csv"
        if self.path.exists():
            with self.path.open(newline="") as handle:
                rows = [r for r in csv.DictReader(handle) if int(r["epoch"]) <= trainer.epoch]
            self._write(rows, mode="w")

    def on_epoch_end(self, trainer: Trainer, row: Mapping[str, Any]) -> None:
        self._write([row], mode="a")

    def _write(self, rows: list[Mapping[str, Any]], mode: str) -> None:
        if not rows:
            if mode == "w":
                self.path.unlink(missing_ok=True)
            return
        new = mode == "w" or not self.path.exists()
        with self.path.open(mode, newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            if new:
                writer.writeheader()
            writer.writerows(rows)


class ConsoleProgress:
    """A progress bar per epoch (losses, img/s, GPU memory) and one line per epoch after it.

    The bar draws only on a terminal; in a log file each epoch is one line.
    """

    name = "progress"

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.bar = None

    def on_epoch_start(self, trainer: Trainer) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=trainer.steps_in_epoch,
            desc=f"epoch {trainer.epoch + 1}/{trainer.cfg.epochs}",
            file=self.stream,
            disable=not getattr(self.stream, "isatty", lambda: False)(),
            leave=False,
            dynamic_ncols=True,
        )

    def on_step_end(self, trainer: Trainer) -> None:
        if self.bar is None:
            return
        self.bar.n = trainer.batch_in_epoch
        if trainer.logged:
            self.bar.set_postfix_str(_format(trainer.logged), refresh=False)
        self.bar.refresh()

    def on_epoch_end(self, trainer: Trainer, row: Mapping[str, Any]) -> None:
        if self.bar is not None:
            self.bar.close()
        shown = {k: v for k, v in row.items() if k != "epoch"}
        log.info("epoch %d/%d  %s", row["epoch"], trainer.cfg.epochs, _format(shown))


def _format(values: Mapping[str, Any]) -> str:
    parts = []
    for key, value in values.items():
        if isinstance(value, float):
            parts.append(f"{key} {value:.4g}")
        elif value not in ("", None):
            parts.append(f"{key} {value}")
    return "  ".join(parts)


class PlotWriter:
    """PNG plots at the end of the run: ``results.png`` (losses and metrics per epoch) and
    ``pr_curve.png`` (precision-recall at IoU 0.5 of the last validation), with matplotlib's
    Agg backend and bundled fonts (no display, no download)."""

    name = "plots"

    def on_train_end(self, trainer: Trainer) -> None:
        from falconet.training.plots import plot_pr_curve, plot_results

        csv_path = trainer.run_dir / "results.csv"
        if csv_path.exists():
            plot_results(csv_path, trainer.run_dir / "results.png")
        if trainer.last_eval is not None and "pr_curve50" in trainer.last_eval.extra:
            plot_pr_curve(trainer.last_eval, trainer.run_dir / "pr_curve.png")


class TensorBoardLogger:
    """Scalars of each epoch row in ``run_dir/tensorboard`` (when tensorboard is installed)."""

    name = "tensorboard"

    def on_train_start(self, trainer: Trainer) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(Path(trainer.run_dir) / "tensorboard"))

    def on_epoch_end(self, trainer: Trainer, row: Mapping[str, Any]) -> None:
        for key, value in row.items():
            if key != "epoch" and isinstance(value, float):
                self.writer.add_scalar(key, value, row["epoch"])
        self.writer.flush()

    def on_train_end(self, trainer: Trainer) -> None:
        self.writer.close()


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True
