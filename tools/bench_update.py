"""The whole step's update, part by part: where its milliseconds go.

``graph=whole-step`` records the update once and replays it after every accumulation window
(``falconet_graphs_cuda.static_step.StaticStep.update``); its share of the step, before and
after the changes this script pointed to, is in docs/lab/2026-11-step-time.md ("The update and
the weights' casts"). This script times that update whole and each of its parts alone, each
recorded as a CUDA graph and replayed (median of ``--repeats`` replays after ``--warmup``, over
``--rounds`` rounds taken round-robin; the median of the rounds is reported): the scaler's
unscale and overflow check (fp16), gradient clipping, the step (weight decay into the
gradients, with fp16 the overflowed step made a no-op, then SGD), that no-op alone (fp16), the
scale update (fp16), the EMA, and zeroing the gradients. The parts' sum against the whole says
what recording them together saves. The trainer is the one ``train`` builds (SGD, the
family's recipe) on ``--data``, its gradients those of one real batch; the update's keys
(``fuse``, ``wgrad_stream``, ``bn_silu``) are the run's.

    cd tools && python bench_update.py --data ../.data/coco128/coco128.yaml --amp fp16,bf16 \\
        --batch 16 --out update.json

Without CUDA each part runs once eagerly (the script's own check) and nothing is timed.
"""

from __future__ import annotations

import torch
from first_batch import (  # tools/ is on the path
    add_row,
    each_case,
    new_results,
    replay_parser,
    save_results,
)

from falconet_graphs_cuda.keys import GraphsCudaKeys
from falconet_graphs_cuda.static_step import StaticStep


def parts(step: StaticStep) -> dict:
    """Name -> the function that runs it; scaler parts only when a scaler is on."""
    scaled = step.scaler is not None
    named = {
        "update (whole)": step.update,
        "unscale": step._unscale if scaled else None,
        "clip": step._clip,
        "step (decay, overflow no-op, sgd)": step._step,
        "overflow no-op (where)": step._neutralise_overflow if scaled else None,
        "scale update": step._update_scale if scaled else None,
        "ema": step._ema,
        "zero grads": step.flat_grads.zero_,
    }
    return {name: torch.no_grad()(fn) for name, fn in named.items() if fn is not None}


def main() -> None:
    parser = replay_parser(__doc__)
    args = parser.parse_args()
    timed = torch.cuda.is_available()
    if timed:
        from graph_replay import replay_ms
    results = new_results()
    for amp, batch_size, trainer, images, targets in each_case(args, "update", optimizer="sgd"):
        options = trainer.cfg.model_dump()  # the run's own fuse, wgrad_stream and bn_silu
        keys = GraphsCudaKeys.model_validate(
            {k: options[k] for k in GraphsCudaKeys.model_fields if k in options}
        )
        step = StaticStep(trainer.run.parts, keys)
        step.make_state()
        step.bind()
        step.micro(images, targets)  # real gradients in the static buffers
        step.fill_scalars(update=True)
        grads = [g.clone() for g in step.grads]
        pieces = parts(step)
        for fn in pieces.values():  # each part once: the check that it runs
            fn()
        torch._foreach_copy_(step.grads, grads)
        times: dict[str, list[float]] = {name: [] for name in pieces}
        for _ in range(args.rounds if timed else 0):
            for name, fn in pieces.items():
                times[name].append(replay_ms(fn, args.warmup, args.repeats))
                torch._foreach_copy_(step.grads, grads)  # "zero grads" and the whole zero them
        row = {"amp": amp, "batch": batch_size, "tensors": len(step.params)}
        row["ema_tensors"] = len(step.ema_tensors()[0][0])
        row["ms"] = {n: sorted(t)[len(t) // 2] if t else None for n, t in times.items()}
        if timed:
            row["parts_sum_ms"] = sum(v for n, v in row["ms"].items() if n != "update (whole)")
        add_row(results, row)
    save_results(args, results)


if __name__ == "__main__":
    main()
