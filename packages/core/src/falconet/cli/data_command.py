"""``falconet data check DATA``: read a whole dataset once and report every problem."""

from __future__ import annotations

import json
import sys
from collections import Counter

import click


@click.group("data")
def data() -> None:
    """Inspect datasets."""


@data.command("check")
@click.argument("dataset")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--strict",
    is_flag=True,
    help="Exit 1 on any problem (background images without labels excepted).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Threads that decode images (default: one per core, at most 32).",
)
def check(dataset: str, as_json: bool, strict: bool, workers: int | None) -> None:
    """Check DATASET (`shapes`, a data yaml or a folder, bare or as `data=...`): every image
    is decoded to the end and every label line parsed; each problem is printed with its file
    and line and what training does about it (skipped, dropped, clipped, converted or noted).

    Exit status: 0 when the data is usable, 1 with --strict when any problem was found, 2 when
    a split has no usable image left or the yaml itself is unusable.
    """
    from falconet.data import DataError, load_dataset

    if dataset.startswith("data="):  # as `falconet train` takes it
        dataset = dataset.removeprefix("data=")
    try:
        loaded = load_dataset(dataset, workers=workers)
    except DataError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    empty = [name for name, split in loaded.splits.items() if not split.samples]
    serious = [p for p in loaded.problems if p.action != "noted"]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "data": loaded.source,
                    "names": loaded.names,
                    "usable": not empty,
                    "splits": {
                        name: {
                            "images": split.images_total,
                            "usable": len(split.samples),
                            "problems": [
                                {
                                    "code": p.code,
                                    "path": p.path,
                                    "line": p.line,
                                    "message": p.message,
                                    "action": p.action,
                                }
                                for p in split.problems
                            ],
                        }
                        for name, split in loaded.splits.items()
                    },
                },
                indent=2,
            )
        )
    else:
        for split in loaded.splits.values():
            for problem in split.problems:
                click.echo(f"{split.name}: {problem}")
        for split in loaded.splits.values():
            counts = Counter(p.code for p in split.problems)
            detail = ", ".join(f"{c}: {n}" for c, n in sorted(counts.items()))
            click.echo(
                f"{split.name}: {len(split.samples)} of {split.images_total} images "
                f"usable" + (f" ({detail})" if detail else ", no problems")
            )
        if empty:
            click.echo(f"error: no usable image left in {', '.join(empty)}", err=True)
    if empty:
        sys.exit(2)
    if strict and serious:
        sys.exit(1)
