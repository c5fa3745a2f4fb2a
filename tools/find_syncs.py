"""Where a training step's host syncs come from: each one with the source line that asked.

    python tools/find_syncs.py --data .data/coco128/coco128.yaml --model detr-n --imgsz 384 \\
        --batch 4,16 --amp bf16 --graph eager,cuda-graph --out syncs.json

``bench_train.py`` counts a step's host syncs (``set_sync_debug_mode("warn")``); this script
says who they are. It builds the run as ``train`` does (``first_batch.py``), runs ``--warmup``
steps, then ``--repeats`` steps with torch's sync warnings turned on, and keeps for each
warning the innermost frames of the Python stack that raised it: a sync asked for by the
network's forward, the loss, the optimizer or a backend shows its file and line; one raised by
a backward op shows the line that called ``backward()`` (the autograd engine hands its
warnings to that thread), or says it came from the engine's own thread. Prints the sites by
count per step and writes them to ``--out``. CUDA only.
"""

from __future__ import annotations

import collections
import json
import threading
import traceback
import warnings
from pathlib import Path

import torch
from first_batch import each_case, new_results, replay_parser

FRAMES = 3  # the innermost frames kept per sync: the op's line and who called it
SKIP = ("torch/", "warnings.py", "find_syncs.py", "contextlib.py")


def site() -> str:
    """The raising thread's innermost frames outside torch, innermost first."""
    if threading.current_thread() is not threading.main_thread():
        return "(autograd engine thread: a backward op that reads back)"
    frames = [f for f in traceback.extract_stack() if not any(s in f.filename for s in SKIP)]
    if not frames:
        return "(no Python caller)"
    return " <- ".join(
        f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} {f.name}"
        for f in reversed(frames[-FRAMES:])
    )


def sync_sites(step, repeats: int) -> collections.Counter:
    """Count the sync warnings of ``repeats`` calls of ``step`` by :func:`site`."""
    sites: collections.Counter = collections.Counter()
    shown = warnings.showwarning

    def record(message, category, *args, **kwargs):
        if "synchroniz" in str(message):
            sites[site()] += 1
        else:
            shown(message, category, *args, **kwargs)

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(repeats):
                step()
            torch.cuda.set_sync_debug_mode(0)
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = shown
    return sites


def main() -> None:
    parser = replay_parser(__doc__)
    parser.add_argument("--graph", default="eager", help="graph backends, comma-separated")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("find_syncs.py: host syncs are a CUDA matter; run it on a GPU machine")
    results = new_results()
    for graph in args.graph.split(","):
        for amp, batch, trainer, images, targets in each_case(args, "syncs", graph=graph):
            run = trainer.run

            def step(run=run, images=images, targets=targets) -> None:
                run.step(images, targets, update=True)

            for _ in range(args.warmup):
                step()
            sites = sync_sites(step, args.repeats)
            row = {
                "model": args.model,
                "graph": run.graph,
                "amp": amp,
                "batch": batch,
                "syncs_per_step": sum(sites.values()) / args.repeats,
                "sites": {k: v / args.repeats for k, v in sites.most_common()},
            }
            results["rows"].append(row)
            print(f"{args.model} {run.graph} {amp} b{batch}: {row['syncs_per_step']:g} a step")
            for where, count in row["sites"].items():
                print(f"  {count:5g}  {where}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
