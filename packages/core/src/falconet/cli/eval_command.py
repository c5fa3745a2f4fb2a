"""``falconet eval GT.json RESULTS.json``: score a COCO results file against COCO ground truth."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from falconet.plugins import Plugins

_PATH = click.Path(path_type=Path, dir_okay=False)


@click.command("eval")
@click.argument("ground_truth", type=_PATH)
@click.argument("results", type=_PATH)
@click.option(
    "--backend",
    default=None,
    help="Eval backend (default: the fastest installed; see `falconet plugins list`).",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="Threads for backends that use several (default: the backend's own).",
)
@click.option("--per-class", is_flag=True, help="Also print AP and AP50 per category.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the 12 stats, per_class, backend and backend_version as JSON.",
)
@click.pass_obj
def eval_command(
    plugins: Plugins,
    ground_truth: Path,
    results: Path,
    backend: str | None,
    threads: int | None,
    per_class: bool,
    as_json: bool,
) -> None:
    """Evaluate a COCO RESULTS file (a list of {image_id, category_id, bbox, score}) against a
    COCO instances GROUND_TRUTH file; bbox AP/AR as pycocotools computes them.

    Exit status 2 when a file cannot be read or does not match the other.
    """
    from falconet.evaluation import EvalBackendUnavailable, EvalInputError
    from falconet.evaluation.coco_json import load_ground_truth, load_results
    from falconet.evaluation.evaluate import evaluate
    from falconet.registry import UnknownNameError

    try:
        gt = load_ground_truth(ground_truth)
        detections = load_results(results)
        result = evaluate(gt, detections, backend=backend, threads=threads, plugins=plugins)
    except (EvalInputError, UnknownNameError, EvalBackendUnavailable) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    crowd = int(gt.ann_iscrowd.sum())
    click.echo(
        f"COCO bbox evaluation: {len(gt.image_ids)} images, {len(gt.ann_image_ids)} "
        f"ground-truth boxes ({crowd} crowd), {len(detections)} detections; "
        f"backend {result.backend} {result.backend_version}"
    )
    keys = list(result.stats)
    for row in (keys[:6], keys[6:]):
        click.echo("  ".join(f"{k:>6}" for k in row))
        click.echo("  ".join(f"{result.stats[k]:6.3f}" for k in row))
    if per_class:
        width = max(len(n) for n in result.per_class_ap) if result.per_class_ap else 8
        click.echo(f"\n{'category':<{width}}  {'AP':>6}  {'AP50':>6}")
        for name, ap in result.per_class_ap.items():
            click.echo(f"{name:<{width}}  {ap:6.3f}  {result.per_class_ap50[name]:6.3f}")
