"""Which ops launch a training step's kernels: every kernel of one eager step, grouped by the
chain of ops that launched it, with its shapes, calls and GPU time.

A profile's top-kernel table names kernels (``direct_copy_kernel_cuda``, ``CUDAFunctor_add``)
but not why they run: a copy can be a ``.contiguous()`` inside a convolution, a cast under
autocast, or a gradient flowing back through a ``chunk``. This script builds the trainer as
``train`` does, runs ``--warmup`` eager training steps on its loader's first batch, profiles
one more, and for each kernel walks up from the op that launched it to the outermost one
(the autograd node's name marks the backward). ``graph=whole-step`` replays the same kernels
as an eager step (bit for bit), so the eager step says where its kernels come from.

    cd tools && python kernel_origins.py --data ../.data/coco128/coco128.yaml --amp fp16 \\
        --batch 16 --match copy --out origins.json

CUDA only (a CPU step launches no kernels).
"""

from __future__ import annotations

import re
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from first_batch import add_row, new_results, replay_parser, save_results, trainer_and_batch
from torch.profiler import ProfilerActivity, profile

from falconet_profiler.kernel_names import label  # what a kernel does, by its name

# names of the profiler's own or the harness's frames, dropped from a chain
SKIP = re.compile(r"^(ProfilerStep|cudaLaunch|cuda|## |<built-in|Optimizer\.)")


def chain(event) -> list[str]:
    """The op that launched ``event``'s kernels and its parents, outermost first."""
    names = []
    while event is not None:
        if not SKIP.match(event.name):
            names.append(event.name)
        event = event.cpu_parent
    return names[::-1]


def origins(trainer, images, targets, warmup: int) -> list[dict]:
    """Kernels of one eager training step, grouped by (kernel kind, op chain, shapes)."""
    step = trainer.run.step
    for _ in range(warmup):
        step(images, targets, update=True)
    torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities, record_shapes=True) as prof:
        step(images, targets, update=True)
        torch.cuda.synchronize()
    groups: dict[tuple, dict] = defaultdict(lambda: {"calls": 0, "us": 0.0})
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA or not event.kernels:
            continue
        ops = chain(event)
        backward = next((n for n in ops if n.startswith("autograd::engine")), None)
        # the innermost three ops say what launched it; the autograd node says for whom
        key_ops = ([backward.split(": ")[-1]] if backward else ["forward"]) + [
            n for n in ops if not n.startswith("autograd::engine")
        ][-3:]
        shapes = str(event.input_shapes)[:160]
        for kernel in event.kernels:
            group = groups[(label(kernel.name), " > ".join(key_ops), shapes)]
            group["calls"] += 1
            group["us"] += kernel.duration
    rows = [
        {"kernel": k, "ops": ops, "shapes": shapes, **v} for (k, ops, shapes), v in groups.items()
    ]
    return sorted(rows, key=lambda r: -r["us"])


def main() -> None:
    parser = replay_parser(__doc__)
    parser.add_argument("--match", default="", help="keep kernels whose kind matches (copy)")
    parser.add_argument("--graph", default="eager")
    parser.add_argument("--top", type=int, default=60)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("kernel_origins.py needs CUDA: a CPU step launches no kernels")
    results = new_results()
    tmp = Path(tempfile.mkdtemp(prefix="origins-"))
    for amp in args.amp.split(","):
        for batch in map(int, args.batch.split(",")):
            trainer, images, targets = trainer_and_batch(
                args, amp, batch, tmp, "origins", graph=args.graph
            )
            rows = origins(trainer, images, targets, args.warmup)
            kept = [r for r in rows if re.search(args.match, r["kernel"])]
            total = {"kernels": sum(r["calls"] for r in rows), "us": sum(r["us"] for r in rows)}
            matched = {"kernels": sum(r["calls"] for r in kept), "us": sum(r["us"] for r in kept)}
            add_row(results, {"amp": amp, "batch": batch, "total": total, "matched": matched})
            for row in kept[: args.top]:
                add_row(results, {"amp": amp, "batch": batch, **row})
    save_results(args, results)


if __name__ == "__main__":
    main()
