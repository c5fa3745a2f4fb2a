"""What ``grad_checkpoint`` costs and saves on a GPU: peak memory and step time per arm.

For each model and each ``grad_checkpoint`` arm (``off``, ``backbone``, ``backbone+neck``) a
fresh network, configured by its family as a run configures it, trains on one fixed synthetic
batch (random images, 24 boxes per image in 32 slots: ``bench_step.make_batch``), channels_last,
under bf16 autocast (``--dtype``), with the family recipe's optimizer (yolo: SGD momentum
0.937 Nesterov; detr: AdamW) and assigner. The step is forward, loss, backward, optimizer step,
``zero_grad``. After ``--warmup`` steps (left out of every number) the allocator's peak is
reset and ``--steps`` steps are timed with CUDA events: ``step_ms`` is their median and
``peak_gib`` the ``torch.cuda.max_memory_allocated`` over them; ``resting_gib`` is what is
allocated between steps (weights, gradients set to None, optimizer state, the batch), so
``peak_gib - resting_gib`` is what the step's activations take. ``--compile`` compiles the
network (``torch.compile``, default mode), as ``graph=compile`` does. The first step's loss is
recorded per arm: checkpointing recomputes the same kernels, so it matches ``off`` up to
cuDNN's nondeterminism. A network that does not fit is recorded as ``oom``.

    python tools/bench_grad_checkpoint.py --models detr-s,yolo-m --imgsz 640 --batch 16 \\
        --json grad_checkpoint.json
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch
from bench_step import make_batch  # tools/ is on the path
from bench_train import median_ms

from falconet.plugins import get_plugins

ARMS = ("off", "backbone", "backbone+neck")
GIB = 1024**3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="detr-s,yolo-m")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--json", default="grad_checkpoint.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_grad_checkpoint measures GPU memory; run it on the GPU machine")
    torch.backends.cudnn.benchmark = True
    plugins = get_plugins()
    result = {
        "script": "tools/bench_grad_checkpoint.py",
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "imgsz": args.imgsz,
        "batch": args.batch,
        "dtype": args.dtype,
        "compile": args.compile,
        "warmup": args.warmup,
        "steps": args.steps,
        "rows": [],
    }
    print(f"{result['gpu']}, torch {result['torch']}, {args.imgsz} px, batch {args.batch}")
    print("| model | grad_checkpoint | step ms | peak GiB | activations GiB | loss |")
    print("| --- | --- | --- | --- | --- | --- |")
    for model in args.models.split(","):
        for arm in args.arms.split(","):
            row = {"model": model, "grad_checkpoint": arm, **measure(plugins, model, arm, args)}
            result["rows"].append(row)
            if "oom" in row:
                print(f"| {model} | {arm} | oom | | | |")
                continue
            print(
                f"| {model} | {arm} | {row['step_ms']:.1f} | {row['peak_gib']:.2f} | "
                f"{row['peak_gib'] - row['resting_gib']:.2f} | {row['first_loss']:.4f} |"
            )
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=1)
    print(f"wrote {args.json}")


def measure(plugins, model: str, arm: str, args: argparse.Namespace) -> dict:
    """One arm: its median step, peak and resting memory, first loss; or ``{"oom": ...}``."""
    gc.collect()
    torch.cuda.empty_cache()
    device = torch.device("cuda")
    family = plugins.families.get(model)
    recipe = family.default_recipe(model)
    family = family.configure({"grad_checkpoint": arm})
    torch.manual_seed(0)
    net = family.build_model(model, 80).to(device, memory_format=torch.channels_last).train()
    loss_fn = family.build_loss(net, plugins.assigners.get(recipe["assigner"]))
    forward = torch.compile(net) if args.compile else net
    if recipe["optimizer"] == "adamw":
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=True)
    else:
        optimizer = torch.optim.SGD(
            net.parameters(), lr=0.01, momentum=0.937, nesterov=True, foreach=True
        )
    images, targets = make_batch(args.batch, args.imgsz, 80, device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    losses = []

    def step() -> None:
        with torch.autocast("cuda", dtype=dtype, enabled=args.dtype != "fp32"):
            total, _ = loss_fn(forward(images), targets)
        total.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not losses:
            losses.append(float(total.detach()))  # the first step only: one read, in warm-up

    try:
        for _ in range(args.warmup):
            step()
        torch.cuda.synchronize()
        resting = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        ms = median_ms(step, warmup=0, steps=args.steps)
        peak = torch.cuda.max_memory_allocated()
    except torch.OutOfMemoryError as exc:
        return {"oom": str(exc).splitlines()[0]}
    return {
        "step_ms": ms,
        "peak_gib": peak / GIB,
        "resting_gib": resting / GIB,
        "first_loss": losses[0],
    }


if __name__ == "__main__":
    main()
