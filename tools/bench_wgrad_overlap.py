"""How much of a training pass the convolutions' weight gradients hold on its critical path:
the most that running them on a second stream, beside the input-gradient chain, could save.

In a backward every convolution computes two gradients: its input's, which the layers before
it wait for, and its weight's, which nothing in the backward waits for (only the update).
One stream runs them in turn. Whether a second stream inside the captured step is worth
building (the same kernels, so the same numbers) depends on how long the weight gradients
take in the serial pass: this script measures it without building anything.

A training pass (the network's forward, the trainer's loss on COCO128's first batch at
``--batch``, the backward; ``bench_blocks.pass_fn``) is recorded as one CUDA graph and replayed
two ways, round-robin, median of ``--repeats`` replays over ``--rounds`` rounds: with the
gradients of every parameter, and with the gradients of every parameter but the convolution
weights, for which autograd then skips cuDNN's weight-gradient kernels (the output mask of
``convolution_backward``). The difference is the weight gradients' time in the serial pass;
overlapped, the pass could lose at most that (the two streams would share the GPU). The
gradients both ways have in common are compared bit for bit.

    cd tools && python bench_wgrad_overlap.py --amp fp16 --batch 16,64 --out wgrad.json

On a machine without CUDA only the comparison runs.
"""

from __future__ import annotations

import torch
from bench_blocks import pass_fn  # tools/ is on the path
from first_batch import add_row, each_case, new_results, replay_parser, save_results
from torch import nn


def main() -> None:
    args = replay_parser(__doc__).parse_args()
    timed = torch.cuda.is_available()
    if timed:
        from graph_replay import replay_ms
    results = new_results()
    for amp, batch_size, trainer, images, targets in each_case(args, "wgrad"):
        net = trainer.model
        every = [p for p in net.parameters() if p.requires_grad]
        weights = {id(m.weight) for m in net.modules() if isinstance(m, nn.Conv2d)}
        others = [p for p in every if id(p) not in weights]
        passes = {
            "every gradient": pass_fn(net, trainer, images, targets, every),
            "no convolution weight gradient": pass_fn(net, trainer, images, targets, others),
        }
        (loss, grads), (loss_rest, grads_rest) = (fn() for fn in passes.values())
        position = {id(p): i for i, p in enumerate(every)}
        equal = sum(
            torch.equal(grads[position[id(p)]], g) for p, g in zip(others, grads_rest, strict=True)
        )
        ms: dict[str, list[float]] = {name: [] for name in passes}
        for _ in range(args.rounds if timed else 0):
            for name, fn in passes.items():
                ms[name].append(replay_ms(fn, args.warmup, args.repeats))
        medians = {name: sorted(v)[len(v) // 2] if v else None for name, v in ms.items()}
        full, rest = medians.values()
        add_row(
            results,
            {
                "amp": amp,
                "batch": batch_size,
                "convolution_weights": len(weights),
                "ms": ms,
                "median_ms": medians,
                "weight_gradient_ms": None if full is None else full - rest,
                "loss_equal": bool(torch.equal(loss, loss_rest)),
                "shared_gradients_equal": equal,
                "shared_gradients": len(others),
            },
        )
    save_results(args, results)


if __name__ == "__main__":
    main()
