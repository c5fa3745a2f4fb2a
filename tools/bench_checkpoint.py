"""An epoch end's checkpoint: what the training thread waits for, written in place or in the
background, and whether the background write still holds the epoch's state.

The trainer saves ``last.pt`` (and, without validation, ``best.pt``) at every epoch's end
(``Trainer._checkpoint_files``). This script builds the trainer ``train`` builds on ``--data``,
gives it an optimizer state with ``--steps`` real steps, then times, over ``--rounds`` rounds
(medians reported, in ms):

* ``state``: gathering the state dicts (the live tensors, no copy);
* ``in_place``: :func:`save_atomic` of each file from the live state, on the training
  thread (how the trainer saved before the background writer);
* ``submit``: :meth:`CheckpointWriter.submit`, the training thread's share of a background
  save (the host snapshot and starting the thread), and ``write``: the wait for the rest;
* ``steps_alone`` and ``steps_during_write``: ``--steps`` training steps on their own, and
  right after a submit while the files are written (what the writer's thread costs the
  next epoch's first steps).

Then the check: a save is submitted, a training step changes the weights at once, and the
file must equal the state of the submit, tensor for tensor (``snapshot_exact``).

    cd tools && python bench_checkpoint.py --data ../.data/coco128/coco128.yaml --amp fp16 \\
        --batch 16 --out checkpoint.json

Any device; on the CPU the same measurement runs against that machine's disk.
"""

from __future__ import annotations

import statistics
import time

import torch
from first_batch import (  # tools/ is on the path
    add_row,
    each_case,
    new_results,
    replay_parser,
    save_results,
)

from falconet.training.checkpoint import CheckpointWriter, load_checkpoint, save_atomic
from falconet.training.host_snapshot import PinnedSnapshot


def synced() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def flat(state, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a nested state by its path: what two checkpoints are compared by."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if not isinstance(state, (dict, list, tuple)):
        return {}
    items = state.items() if isinstance(state, dict) else enumerate(state)
    return {k: v for key, value in items for k, v in flat(value, f"{prefix}/{key}").items()}


def measure(args, trainer, images, targets) -> dict:
    """The timings and the check for one trainer and its batch (module docstring)."""

    def steps(n: int) -> None:
        for _ in range(n):
            trainer.run.step(images, targets, update=True)

    steps(max(args.steps, 5))  # an optimizer state, and whole-step's recording
    files = trainer._checkpoint_files()
    writer = CheckpointWriter()
    ms: dict[str, list[float]] = {
        k: [] for k in ("state", "in_place", "submit", "write", "steps_alone", "steps_during_write")
    }
    for _ in range(args.rounds):
        start = synced()
        files = trainer._checkpoint_files()
        ms["state"].append((synced() - start) * 1e3)
        start = synced()
        for state, path in files:
            save_atomic(state, path)
        ms["in_place"].append((synced() - start) * 1e3)
        start = synced()
        steps(args.steps)
        ms["steps_alone"].append((synced() - start) * 1e3)
        start = synced()
        writer.submit(files)
        ms["submit"].append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()
        writer.wait()
        ms["write"].append((time.perf_counter() - start) * 1e3)
        writer.submit(trainer._checkpoint_files())
        start = synced()
        steps(args.steps)
        ms["steps_during_write"].append((synced() - start) * 1e3)
        writer.wait()
    # the check: the file holds the state of the submit, not of the step right after it
    files = trainer._checkpoint_files()
    snapshot = PinnedSnapshot().take([files[0][0]])[0]
    synced()  # the snapshot's copies are asynchronous on a GPU
    before = flat(snapshot)
    writer.submit(files)
    steps(1)
    writer.wait()
    written = flat(load_checkpoint(files[0][1]))
    changed = sum(
        not torch.equal(before[k], t.cpu()) for k, t in flat(files[0][0]).items() if k in before
    )
    equal = sum(torch.equal(before[k], written[k]) for k in before)
    return {
        "graph": trainer.run.graph,
        "files": [str(path.name) for _, path in files],
        "megabytes": round(sum(path.stat().st_size for _, path in files) / 2**20, 1),
        "tensors": len(before),
        "ms": {k: round(statistics.median(v), 2) for k, v in ms.items()},
        "snapshot_exact": equal == len(before),
        "tensors_equal": equal,
        "tensors_changed_by_the_step": changed,
    }


def main() -> None:
    parser = replay_parser(__doc__)
    parser.set_defaults(amp="fp16", rounds=5)
    parser.add_argument("--steps", type=int, default=10, help="training steps timed per round")
    parser.add_argument("--graph", default="eager", help="the trainer's graph= key")
    args = parser.parse_args()
    results = new_results()
    for amp, batch_size, trainer, images, targets in each_case(
        args, "checkpoint", graph=args.graph
    ):
        row = {"amp": amp, "batch": batch_size, **measure(args, trainer, images, targets)}
        add_row(results, row)
    save_results(args, results)


if __name__ == "__main__":
    main()
