"""``falconet train|val|predict KEY=VALUE ...``: the Detector API with the same keys.

Errors a user can fix (an unknown key, a bad value, unusable data, a refused checkpoint, a
missing plugin) print one ``error:`` message and exit 2; a run stopped by a non-finite loss
exits 1. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

EPILOG_WIDTH = 100


def _keys_epilog(width: int = EPILOG_WIDTH) -> str:
    """Every key, the core's first, then each plugin's under its distribution's name; each
    meaning wrapped to ``width`` columns under its own column."""
    from falconet.plugins import get_plugins
    from falconet.training.config import CORE, config_model, describe_keys

    plugins = get_plugins()
    installed = _installed_names(plugins)
    lines = ["\b", "Keys (KEY=VALUE; default, meaning):"]
    owner = CORE
    indent = " " * 36  # two spaces, the key's 20 and a space, the default's 12 and a space
    rows = describe_keys(config_model(plugins))
    # the core's keys together, its built-in plugin's key groups (grad_checkpoint) included
    rows = sorted(rows, key=lambda row: row[3] != CORE)
    for key, default, meaning, declared_by in rows:
        if key in installed:
            meaning = f"{meaning}; installed: {installed[key]}"
        if declared_by != owner:
            owner = declared_by
            lines += ["\b", f"Keys of {owner}:"]
        head = f"  {key:<20} {default:<12} "
        if len(head) > len(indent):  # a long default: the meaning starts on the next line
            lines.append(head.rstrip())
            head = indent
        lines += textwrap.wrap(
            meaning,
            width=max(width, len(indent) + 20),
            initial_indent=head,
            subsequent_indent=indent,
            break_on_hyphens=False,
        ) or [head.rstrip()]
    return "\n".join(lines)


def _installed_names(plugins: Any) -> dict[str, str]:
    """For each key that names a registered item (``amp_dtype``, ``graph``, ``assigner``,
    ``eval_backend``), the names installed plugins registered, so the help lists what this
    installation accepts (``fp8`` only where its plugin is installed)."""
    selectors = ("precision_backends", "graph_backends", "assigners", "eval_backends")
    return {
        registry.key: ", ".join(sorted(registry.names()))
        for kind, registry in plugins.registries.items()
        if kind in selectors and len(registry)
    }


def _user_errors() -> tuple[type[BaseException], ...]:
    from falconet.data.records import DataError
    from falconet.evaluation import EvalBackendUnavailable
    from falconet.registry import RegistryError
    from falconet.training.checkpoint import CheckpointError
    from falconet.training.config import ConfigError

    return ConfigError, DataError, CheckpointError, RegistryError, EvalBackendUnavailable


def _run(action: Callable[[], Any]) -> Any:
    from falconet.training.trainer import TrainingDiverged

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        return action()
    except TrainingDiverged as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except _user_errors() as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


def _pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    from falconet.training.config import parse_cli_pairs

    return _run(lambda: parse_cli_pairs(pairs))


class _KeysCommand(click.Command):
    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        width = min(formatter.width, EPILOG_WIDTH)  # the terminal's, as click measured it
        formatter.write("\n" + _keys_epilog(width).replace("\b\n", "") + "\n")


@click.command("train", cls=_KeysCommand, context_settings={"max_content_width": EPILOG_WIDTH})
@click.argument("keys", nargs=-1)
def train(keys: tuple[str, ...]) -> None:
    """Train a detector: `falconet train model=yolo-n data=shapes epochs=50`.

    With no keys: the default model of the installed family of highest priority (yolo-n
    where the YOLO family is installed) on the built-in `shapes` data, on the GPU if there is
    one. Every key below is also a keyword of `Detector.train`. Output goes to
    runs/train/<name>.

    The defaults below are the core's: the model family's recipe, then the data yaml's
    train_defaults:, override them, and your keys override both; the resolved keys are
    printed when the run starts and saved in args.yaml.
    """
    from falconet.detector import Detector

    values = _pairs(keys)

    def action() -> dict[str, Any]:
        model = values.pop("model", None)
        detector = Detector(model) if model else Detector()
        return detector.train(**values)

    summary = _run(action)
    from falconet.training.distributed import world_from_env

    world = world_from_env()
    if world.main:  # one summary for a distributed run, rank 0's
        click.echo(_summary_table(summary))
    if world.distributed:
        _leave_worker()


def _leave_worker() -> None:
    """End a torchrun worker whose run ended well without the interpreter's teardown: the
    process group is already destroyed and every file written, but a Gloo thread still
    joining at finalization aborts a rank now and then ("terminate called without an active
    exception"), which would turn a finished run into a failed job."""
    import os

    logging.shutdown()  # every handler flushed and closed
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _summary_table(summary: dict[str, Any]) -> str:
    lines = [f"run folder: {summary['run_dir']}"]
    if summary.get("stop_reason"):
        lines.append(summary["stop_reason"])
    metrics = summary["metrics"]
    if metrics:
        lines.append(
            f"best epoch {summary['best_epoch']}: mAP50-95 {metrics['AP']:.4f}  "
            f"mAP50 {metrics['AP50']:.4f}"
        )
        lines.append(f"{'class':<20} {'AP50':>8} {'AP50-95':>8}")
        for name, ap in summary["per_class_ap"].items():
            lines.append(f"{name:<20} {summary['per_class_ap50'][name]:>8.4f} {ap:>8.4f}")
    return "\n".join(lines)


@click.command("val", cls=_KeysCommand, context_settings={"max_content_width": EPILOG_WIDTH})
@click.argument("keys", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
def val(keys: tuple[str, ...], as_json: bool) -> None:
    """Evaluate a checkpoint: `falconet val model=runs/train/exp/weights/best.pt [data=...]`.

    Uses the keys saved in the checkpoint (data, imgsz, ...) unless given.
    """
    import json

    from falconet.detector import Detector

    values = _pairs(keys)
    if "model" not in values:
        raise click.UsageError("val needs model=PATH/best.pt")

    result = _run(lambda: Detector(values.pop("model")).val(**values))
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=1))
        return
    click.echo(
        f"mAP50-95 {result.stats['AP']:.4f}  mAP50 {result.stats['AP50']:.4f}  "
        f"({result.backend} {result.backend_version})"
    )
    for name, ap in result.per_class_ap.items():
        click.echo(f"  {name:<20} AP50 {result.per_class_ap50[name]:.4f}  AP {ap:.4f}")


@click.command("predict")
@click.argument("keys", nargs=-1)
def predict(keys: tuple[str, ...]) -> None:
    """Detect objects: `falconet predict model=best.pt source=images/ [conf=0.25 iou=0.7
    imgsz=640 device=auto max_det=300 project=runs/predict name=exp]`.

    Writes annotated copies of the images and predictions.json to runs/predict/<name>.
    """
    from falconet.detector import Detector
    from falconet.predict import write_outputs
    from falconet.training.run_dir import new_run_dir

    values = _pairs(keys)
    allowed = {
        "model",
        "source",
        "conf",
        "iou",
        "imgsz",
        "device",
        "max_det",
        "project",
        "name",
        "batch",
    }
    unknown = sorted(set(values) - allowed)
    if unknown or "model" not in values or "source" not in values:
        raise click.UsageError(
            (f"unknown key(s) {', '.join(unknown)}; " if unknown else "")
            + "predict takes model= and source=, and optionally "
            + ", ".join(sorted(allowed - {"model", "source"}))
        )

    def number(key: str, kind: type, default: Any) -> Any:
        from falconet.training.config import ConfigError

        try:
            return kind(values[key]) if key in values else default
        except ValueError:
            raise ConfigError(f"{key}={values[key]!r}: expected {kind.__name__}") from None

    def action() -> Path:
        detector = Detector(values["model"])
        results = detector.predict(
            values["source"],
            conf=number("conf", float, 0.25),
            iou=number("iou", float, 0.7),
            max_det=number("max_det", int, 300),
            imgsz=number("imgsz", int, None),
            device=values.get("device", "auto"),
            batch=number("batch", int, 16),
        )
        folder = new_run_dir(
            values.get("project", "runs/predict"), values.get("name", "exp"), weights=False
        )
        return write_outputs(results, folder)

    target = _run(action)
    click.echo(f"detections: {target}\nannotated images: {target.parent}")
