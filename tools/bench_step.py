"""One YOLO training step, measured: time per step and host synchronisations per step.

The step is forward, loss (assignment included), backward and an SGD step (foreach, momentum
0.937, Nesterov) on a fixed synthetic batch (random images, 24 boxes per image padded to a
bucket of 32), channels_last, under the chosen autocast dtype. Warm-up steps are left out; the
time is the median over ``--steps`` steps, each timed with CUDA events. Synchronisations are
counted with ``torch.cuda.set_sync_debug_mode("warn")`` over one whole step; a second step runs
under ``"error"`` to show where the first one is, if any.

    python tools/bench_step.py --model yolo-n --batch 16,64 --assigner tal
"""

from __future__ import annotations

import argparse
import warnings

import torch
from bench_train import median_ms  # the same CUDA-event timing (tools/ is on the path)

from falconet.data.targets import Targets
from falconet.plugins import get_plugins


def make_batch(
    batch: int, imgsz: int, classes: int, device: torch.device
) -> tuple[torch.Tensor, Targets]:
    """Random channels-last images and their :class:`Targets` (24 boxes per image in 32 slots,
    both views), on ``device``."""
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(batch, 32, 2, generator=g) * (imgsz - 64)
    boxes = torch.cat((xy, xy + 8 + torch.rand(batch, 32, 2, generator=g) * 56), -1)
    counts = torch.full((batch,), 24)
    boxes[:, 24:] = 0
    images = torch.rand(batch, 3, imgsz, imgsz, generator=g)
    images = images.to(device).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, classes, (batch, 32), generator=g)
    # the per-box view is made from the counts on the host, as the loader makes it
    return images, Targets.from_padded(boxes, labels, counts).to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="yolo-n")
    parser.add_argument("--batch", default="16,64")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--assigner", default="tal")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_step measures a CUDA step; run it on the GPU machine")
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    plugins = get_plugins()
    family = plugins.families.get(args.model)
    assigner = plugins.assigners.get(args.assigner)
    print(
        f"{args.model}, {args.imgsz} px, {args.dtype} autocast, assigner {args.assigner}, "
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}"
    )
    print("| batch | step ms (median) | img/s | host syncs per step |")
    print("| --- | --- | --- | --- |")
    for batch_size in (int(b) for b in args.batch.split(",")):
        ms, syncs = measure(family, assigner, batch_size, args, device)
        print(f"| {batch_size} | {ms:.1f} | {batch_size * 1000 / ms:.0f} | {syncs} |")


def measure(
    family, assigner, batch_size: int, args: argparse.Namespace, device: torch.device
) -> tuple[float, int]:
    """(median step ms, host synchronisations in one step) for one batch size."""
    net = family.build_model(args.model, 80).to(device).to(memory_format=torch.channels_last)
    loss_fn = family.build_loss(net, assigner)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.937, nesterov=True, foreach=True)
    images, targets = make_batch(batch_size, args.imgsz, 80, device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    def step() -> None:
        with torch.autocast("cuda", dtype=dtype, enabled=args.dtype != "fp32"):
            total, _ = loss_fn(net(images), targets)
        total.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        step()
        torch.cuda.set_sync_debug_mode(0)
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    if syncs:
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
        except RuntimeError as exc:
            print(f"first sync: {exc}")
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return median_ms(step, warmup=0, steps=args.steps), syncs  # warmed up above


if __name__ == "__main__":
    main()
