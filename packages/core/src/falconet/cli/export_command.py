"""``falconet export model=best.pt [format=onnx opset=17 dynamic=false ...]``: the
``Detector.export`` API with the same keys.

A value to fix (a bad key, a missing file or package, a checkpoint without the weights asked
for) prints one ``error:`` line and exits 2; a written file whose outputs differ from
PyTorch's beyond the tolerance exits 1.
"""

from __future__ import annotations

import json
import logging
import sys

import click


def _keys_help() -> str:
    from falconet.export import ExportOptions

    lines = [
        "\b",
        "Keys (KEY=VALUE; default, meaning):",
        "  model                -            the checkpoint (.pt) to export",
    ]
    for key, field in ExportOptions.model_fields.items():
        default = field.get_default()
        shown = "-" if default is None else str(default).lower()
        lines.append(f"  {key:<20} {shown:<12} {field.description}")
    return "\n".join(lines)


class _ExportCommand(click.Command):
    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write("\n" + _keys_help().replace("\b\n", "") + "\n")


@click.command("export", cls=_ExportCommand, context_settings={"max_content_width": 100})
@click.argument("keys", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def export(keys: tuple[str, ...], as_json: bool) -> None:
    """Write a trained checkpoint as an ONNX file and check it against PyTorch:
    `falconet export model=runs/train/exp/weights/best.pt [dynamic=true opset=17]`.

    The file goes beside the checkpoint (best.pt -> best.onnx) unless out= says where; it
    holds the network and its box decoding (docs/export.md says what it outputs, per family).
    Needs the export extra: pip install 'falconet-core[export]'.
    """
    from falconet.detector import Detector
    from falconet.export import ExportError, ParityError
    from falconet.registry import RegistryError
    from falconet.training.checkpoint import CheckpointError
    from falconet.training.config import ConfigError, parse_cli_pairs

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        values = parse_cli_pairs(keys)
        model = values.pop("model", None)
        if not model:
            raise ExportError(
                "export needs model=PATH, a trained checkpoint such as "
                "model=runs/train/exp/weights/best.pt"
            )
        if model.endswith(".pt"):
            from pathlib import Path

            if not Path(model).is_file():
                raise ExportError(
                    f"model={model}: no such checkpoint file; export takes what falconet train "
                    "wrote, e.g. model=runs/train/exp/weights/best.pt"
                )
        result = Detector(model).export(**values)
    except ParityError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except (ExportError, CheckpointError, ConfigError, RegistryError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "path": str(result.path),
                    "format": result.format,
                    "opset": result.opset,
                    "batch": result.batch,
                    "imgsz": result.imgsz,
                    "weights": result.weights,
                    "shapes": result.shapes,
                    "candidates": result.candidates,
                    "selection": result.selection,
                    "parity": [vars(p) for p in result.parity],
                },
                indent=1,
            )
        )
        return
    click.echo(result.summary())
