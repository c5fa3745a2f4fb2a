"""Is Inductor's fused network less precise than eager under autocast? One batch's gradients
and BatchNorm statistics, eager and compiled, each against an fp32 reference.

``fuse=inductor`` trained to a lower mAP than eager on the overfit check (docs/performance.md)
while following it to rounding on the CPU in fp32. This script asks whether fusion makes the
low-precision step less exact: from the same weights and batch (``bench_step.make_batch``:
random images, 24 boxes per image), the gradient of the YOLO loss is computed in fp32 eager
(the reference), under ``--amp`` autocast eager, and under ``--amp`` autocast with the
network compiled by Inductor (default mode, as ``fuse=inductor`` does); for each kind of
parameter the relative error ``|g - g_ref| / |g_ref|`` is reported, and the same for the
BatchNorm running statistics after the forward pass. A fused network whose errors are larger
than eager's points at its kernels; smaller or equal errors say the difference in training
is not lost precision.

    python tools/fused_precision.py --device cuda --batch 16 --imgsz 640 --out precision.json
"""

from __future__ import annotations

import argparse
import copy
import json
from collections import defaultdict
from pathlib import Path

import torch
from bench_step import make_batch  # tools/ is on the path

from falconet.plugins import get_plugins

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def kind(name: str) -> str:
    """``head:bn.weight``, ``conv.weight``, ...: what the errors are grouped by."""
    leaf = name.rsplit(".", 1)[-1]
    layer = "bn" if ".bn." in name else "conv"
    return ("head:" if name.startswith("head") else "") + f"{layer}.{leaf}"


def one_pass(network, loss_fn, batch, device, amp, compiled: bool):
    """Loss, gradients and running statistics of one forward + backward of a copy."""
    model = copy.deepcopy(network)
    forward = torch.compile(model, dynamic=False) if compiled else model
    with torch.autocast(device.type, amp or torch.float32, enabled=amp is not None):
        outputs = forward(batch["images"])
    loss, _ = loss_fn(outputs, batch)
    loss.backward()
    grads = {n: p.grad.detach().double() for n, p in model.named_parameters()}
    stats = {n: b.detach().double() for n, b in model.named_buffers() if "running" in n}
    return float(loss.detach()), grads, stats


def relative_errors(got: dict, reference: dict) -> dict[str, float]:
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, ref in reference.items():
        sums[kind(name)][0] += float((got[name] - ref).norm() ** 2)
        sums[kind(name)][1] += float(ref.norm() ** 2)
    return {k: (e / r) ** 0.5 if r else 0.0 for k, (e, r) in sorted(sums.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="yolo-n")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument(
        "--memory-format",
        default="channels_last",
        choices=("channels_last", "contiguous"),
        help="the trainer's is channels_last; contiguous steps around the CPU fault of "
        "tools/repro_inductor_bf16_concat.py",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    plugins = get_plugins()
    family = plugins.families.get(args.model)
    network = family.build_model(args.model, 80).to(device)
    layout = {"channels_last": torch.channels_last, "contiguous": torch.contiguous_format}[
        args.memory_format
    ]
    network = network.to(memory_format=layout).train()
    loss_fn = family.build_loss(network, plugins.assigners.get("tal"))
    batch = make_batch(args.batch, args.imgsz, 80, device)
    batch["images"] = batch["images"].contiguous(memory_format=layout)
    amp = DTYPES[args.amp]
    loss_ref, grads_ref, stats_ref = one_pass(network, loss_fn, batch, device, None, False)
    report = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "settings": vars(args) | {"out": str(args.out) if args.out else None},
        "loss": {"fp32": loss_ref},
        "grad_relative_error": {},
        "running_stats_relative_error": {},
    }
    for arm, compiled in (("eager", False), ("compiled", True)):
        loss, grads, stats = one_pass(network, loss_fn, batch, device, amp, compiled)
        report["loss"][arm] = loss
        report["grad_relative_error"][arm] = relative_errors(grads, grads_ref)
        report["running_stats_relative_error"][arm] = relative_errors(stats, stats_ref)
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
