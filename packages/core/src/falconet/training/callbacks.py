"""Callbacks: the observers of a run, and the core's own (CSV log, console progress, plots,
TensorBoard).

The trainer fires ``on_train_start``, ``on_epoch_start``, ``on_step_end`` (after each batch,
whether or not it stepped the optimizer), ``on_val_end(result)``, ``on_epoch_end(row)`` (the
epoch's ``results.csv`` row), ``on_train_end`` and ``on_exception(exc)``, each with the
run's typed view first (:class:`~falconet.training.run_state.RunState`). The core's loggers
are registered callbacks like any plugin's (``wanted`` says when a run adds them); none of
them reads device tensors per step (the loop hands them host numbers at its log interval).
"""

from __future__ import annotations

import csv
import logging
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from falconet.training.config import TrainConfig
    from falconet.training.run_state import RunState

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

    def fire(self, event: str, run: RunState, *args: Any) -> None:
        for callback in self.callbacks:
            method = getattr(callback, event, None)  # every event is optional (Callback)
            if method is not None:
                method(run, *args)


class CSVLogger:
    """``results.csv``: one row per epoch; on resume, rows of epochs to be redone are dropped."""

    name = "csv"
    summary = "results.csv: one row per epoch"

    @staticmethod
    def wanted(config: TrainConfig) -> bool:
        return True

    def on_train_start(self, run: RunState) -> None:
        self.path = run.run_dir / "results.csv"
        if self.path.exists():
            with self.path.open(newline="") as handle:
                rows = [r for r in csv.DictReader(handle) if int(r["epoch"]) <= run.epoch]
            self._write(rows, mode="w")

    def on_epoch_end(self, run: RunState, row: Mapping[str, Any]) -> None:
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
    summary = "a progress bar per epoch and one log line per epoch"

    @staticmethod
    def wanted(config: TrainConfig) -> bool:
        return True

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.bar = None

    def on_epoch_start(self, run: RunState) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=run.batches_per_epoch,
            desc=f"epoch {run.epoch + 1}/{run.config.epochs}",
            file=self.stream,
            disable=not getattr(self.stream, "isatty", lambda: False)(),
            leave=False,
            dynamic_ncols=True,
        )

    def on_step_end(self, run: RunState) -> None:
        if self.bar is None:
            return
        self.bar.n = run.batch_in_epoch
        if run.logged:
            self.bar.set_postfix_str(_format(run.logged), refresh=False)
        self.bar.refresh()

    def on_epoch_end(self, run: RunState, row: Mapping[str, Any]) -> None:
        if self.bar is not None:
            self.bar.close()
        shown = {k: v for k, v in row.items() if k != "epoch"}
        log.info("epoch %d/%d  %s", row["epoch"], run.config.epochs, _format(shown))


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
    summary = "results.png and pr_curve.png at the end of the run (plots=true)"

    @staticmethod
    def wanted(config: TrainConfig) -> bool:
        return config.plots

    def on_train_end(self, run: RunState) -> None:
        from falconet.training.plots import plot_pr_curve, plot_results

        csv_path = run.run_dir / "results.csv"
        if csv_path.exists():
            plot_results(csv_path, run.run_dir / "results.png")
        if run.last_eval is not None and "pr_curve50" in run.last_eval.extra:
            plot_pr_curve(run.last_eval, run.run_dir / "pr_curve.png")


class TensorBoardLogger:
    """Scalars of each epoch row in ``run_dir/tensorboard`` (when tensorboard is installed)."""

    name = "tensorboard"
    summary = "epoch scalars in run_dir/tensorboard, when tensorboard is installed"

    @staticmethod
    def wanted(config: TrainConfig) -> bool:
        return tensorboard_available()

    def on_train_start(self, run: RunState) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(Path(run.run_dir) / "tensorboard"))

    def on_epoch_end(self, run: RunState, row: Mapping[str, Any]) -> None:
        for key, value in row.items():
            if key != "epoch" and isinstance(value, float):
                self.writer.add_scalar(key, value, row["epoch"])
        self.writer.flush()

    def on_train_end(self, run: RunState) -> None:
        self.writer.close()


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


LOGGERS = (CSVLogger, ConsoleProgress, PlotWriter, TensorBoardLogger)
"""The core's loggers, registered through ``register_callbacks`` like any plugin's callback."""
