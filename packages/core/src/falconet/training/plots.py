"""PNG plots of a run, drawn with matplotlib's Agg backend (no display, bundled fonts only)."""

from __future__ import annotations

import csv
from pathlib import Path

from falconet.evaluation.contract import EvalResult


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_results(csv_path: Path, target: Path) -> Path:
    """One panel per numeric column of ``results.csv`` (losses, lr, metrics) over epochs."""
    with csv_path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns = [c for c in rows[0] if c != "epoch" and any(r[c] for r in rows)]
    plt = _pyplot()
    cols = 4
    nrows = -(-len(columns) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3 * nrows), squeeze=False)
    for ax, column in zip(axes.flat, columns, strict=False):
        points = [(int(r["epoch"]), float(r[column])) for r in rows if r[column] not in ("", None)]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".")
        ax.set_title(column)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(columns) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target


def plot_pr_curve(result: EvalResult, target: Path) -> Path:
    """Precision against recall at IoU 0.5, one thin line per class and the mean in bold."""
    plt = _pyplot()
    curves = result.extra["pr_curve50"]
    recall = [i / 100 for i in range(101)]
    fig, ax = plt.subplots(figsize=(6, 5))
    defined = []
    for name, precision in curves.items():
        if all(p < 0 for p in precision):
            continue
        clean = [max(p, 0.0) for p in precision]
        defined.append(clean)
        ap50 = result.per_class_ap50.get(name, -1)
        ax.plot(recall, clean, linewidth=1, label=f"{name} {ap50:.3f}")
    if defined:
        mean = [sum(col) / len(defined) for col in zip(*defined, strict=True)]
        ax.plot(
            recall,
            mean,
            linewidth=3,
            color="black",
            label=f"all classes {result.stats['AP50']:.3f} mAP50",
        )
    ax.set(
        xlabel="recall",
        ylabel="precision",
        xlim=(0, 1),
        ylim=(0, 1.02),
        title="precision-recall, IoU 0.50",
    )
    ax.grid(alpha=0.3)
    if len(curves) <= 20:
        ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target
