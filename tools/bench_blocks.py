"""The YOLO network's forward and backward with and without three copy-saving block changes,
side by side: what each buys, and whether the numbers move.

The changes (plugins/detect: ``blocks.py``, ``network.py``), each against the form before it:

* ``up``: the neck's 2x nearest upsampling in the input's dtype (``Upsample2x``); before,
  ``nn.Upsample`` under autocast, which runs in float32 and makes the concatenation after it
  float32 too;
* ``pool``: SPPF's 5x5 max-pools as a 1x5 pool then a 5x1 one; before, ``nn.MaxPool2d(5)``;
* ``head``: the head's levels joined as ``[B, H x W, C]`` views of the channels-last maps;
  before, ``flatten(2)`` (a copy), ``cat`` along the cells and a transpose, which left the
  loss reading strided rows.

For each variant (``before``, each change alone, ``after`` = all three) the network's forward,
a stand-in for the loss's reads (a log-softmax over the box distributions, as DFL does, and
the class logits; float32) and the backward to every parameter are recorded as one CUDA graph
and replayed: median of ``--repeats`` replays after ``--warmup``, over ``--rounds`` rounds
taken round-robin (the median of the rounds is reported). Every variant starts from the same
weights and input, and its outputs and parameter gradients are compared with ``before``'s
(bit-equal count and largest difference).

    python tools/bench_blocks.py --batch 16,64 --amp fp16,bf16 --out blocks.json

On a machine without CUDA (``--device cpu``) only the comparison runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import types
from pathlib import Path

import torch
from torch import nn

from falconet.plugins import get_plugins

VARIANTS = ("before", "up", "pool", "head", "after")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def head_before(self, features):
    """The head's forward before ``head``: ``flatten(2)``, ``cat`` over cells, transpose."""
    box = torch.cat([b(f).flatten(2) for b, f in zip(self.box, features, strict=True)], 2)
    cls = torch.cat([c(f).flatten(2) for c, f in zip(self.cls, features, strict=True)], 2)
    anchors, strides = self.grid([tuple(f.shape[2:]) for f in features], box.device, torch.float32)
    return box.transpose(1, 2), cls.transpose(1, 2), anchors, strides


def variant(network: nn.Module, name: str) -> nn.Module:
    """A copy of ``network`` with the changes ``name`` leaves out put back to their old form."""
    net = copy.deepcopy(network)
    keep = {"before": (), "after": ("up", "pool", "head")}.get(name, (name,))
    if "up" not in keep:
        net.up = nn.Upsample(scale_factor=2, mode="nearest")
    if "pool" not in keep:
        for module in net.modules():
            if type(module).__name__ == "SPPF":
                # an instance attribute wins over the class's pool method
                object.__setattr__(module, "pool", nn.MaxPool2d(module.k, 1, module.k // 2))
    if "head" not in keep:
        net.head.forward = types.MethodType(head_before, net.head)
    return net


def pass_fn(net: nn.Module, images: torch.Tensor, amp: torch.dtype | None):
    """Forward, the loss stand-in and the gradients of every parameter: one training pass."""
    params = [p for p in net.parameters() if p.requires_grad]

    def run():
        with torch.autocast(images.device.type, amp, enabled=amp is not None):
            box, cls, _, _ = net(images)
        b, a, _ = box.shape
        dfl = box.float().view(b, a, 4, -1).log_softmax(-1)
        loss = dfl[..., 0].sum() * 1e-4 - cls.float().sigmoid().sum() * 1e-4
        grads = torch.autograd.grad(loss, params)
        # detached: outputs that kept the autograd graph alive would keep its AccumulateGrad
        # nodes, and with them the stream of this call, into the next (a capture then fails)
        return box.detach(), cls.detach(), grads

    return run


def compare(got, reference) -> dict:
    pairs = [*zip(got[:2], reference[:2], strict=True), *zip(got[2], reference[2], strict=True)]
    equal = sum(torch.equal(a, b) for a, b in pairs)
    gap = max(float((a.double() - b.double()).abs().max().detach()) for a, b in pairs)
    return {
        "outputs_equal": all(torch.equal(got[i], reference[i]) for i in (0, 1)),
        "tensors_equal": equal,
        "tensors": len(pairs),
        "max_abs_diff": gap,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="yolo-n")
    parser.add_argument("--batch", default="16")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--amp", default="fp16,bf16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    timed = device.type == "cuda"
    if timed:
        sys.path.insert(0, str(Path(__file__).parent))
        from graph_replay import replay_ms
    family = get_plugins().families.get(args.model)
    results = {"torch": torch.__version__, "device": str(device), "rows": []}
    if timed:
        results["device"] = torch.cuda.get_device_name(device)
    for amp_name in args.amp.split(","):
        amp = None if amp_name == "fp32" else DTYPES[amp_name]
        for batch in map(int, args.batch.split(",")):
            torch.manual_seed(0)
            base = family.build_model(args.model, 80).to(device, memory_format=torch.channels_last)
            images = torch.rand(batch, 3, args.imgsz, args.imgsz, device=device)
            images = images.contiguous(memory_format=torch.channels_last)
            nets = {name: variant(base, name) for name in VARIANTS}
            first = {name: pass_fn(net, images, amp)() for name, net in nets.items()}
            rows = {
                name: {
                    "amp": amp_name,
                    "batch": batch,
                    "variant": name,
                    "ms": [],
                    **compare(first[name], first["before"]),
                }
                for name in VARIANTS
            }
            del first
            for _ in range(args.rounds if timed else 0):
                for name, net in nets.items():
                    rows[name]["ms"].append(
                        replay_ms(pass_fn(net, images, amp), args.warmup, args.repeats)
                    )
            for row in rows.values():
                row["median_ms"] = sorted(row["ms"])[len(row["ms"]) // 2] if row["ms"] else None
                results["rows"].append(row)
                ms = f"{row['median_ms']:.3f} ms" if row["median_ms"] is not None else "-"
                print(
                    f"{amp_name} b{batch} {row['variant']:>6}: {ms}; outputs equal "
                    f"{row['outputs_equal']}, {row['tensors_equal']}/{row['tensors']} tensors "
                    f"equal, largest difference {row['max_abs_diff']:.3g}",
                    flush=True,
                )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
