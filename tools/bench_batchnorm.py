"""BatchNorm's kernels alone, for every BatchNorm of a family's network: which backend torch
picks, and what the forward and backward of all of them cost on the GPU per batch.

With the launches gone (graph=whole-step), BatchNorm's native channels-last kernels are the
top three of the profile in bf16 (docs/performance.md), while in fp16 and fp32 torch hands
BatchNorm to cuDNN. This script says whether a BatchNorm that called cuDNN in bf16 too would
pay, before anyone writes one: for each BatchNorm input of the network at ``--batch`` (shapes
taken from one forward pass, channels_last), the forward and backward of every layer are
recorded as one CUDA graph (so launches cost nothing, as in whole-step) and replayed; the
median of ``--repeats`` replays, after ``--warmup``, timed with CUDA events.

Variants: ``native-bf16`` (what training runs now), ``cudnn-bf16`` (``aten.cudnn_batch_norm``
called directly; reported as failed if cuDNN refuses bf16), ``fp16`` (torch's own choice,
cuDNN). The outputs of ``cudnn-bf16`` are compared with ``native-bf16``'s.

    python tools/bench_batchnorm.py --model yolo-n --batch 16,64 --out bn.json
"""

from __future__ import annotations

import json
from functools import partial

import torch
import torch.nn.functional as F
from graph_replay import kernel_parser, kernel_report, replay_ms  # tools/ is on the path

from falconet.plugins import get_plugins

MOMENTUM, EPS = 0.03, 1e-3


def bn_shapes(model: str, batch: int, imgsz: int) -> list[tuple[int, ...]]:
    """The input shape of every BatchNorm2d in the network, in forward order."""
    family = get_plugins().families.get(model)
    network = family.build_model(model, 80).cuda().to(memory_format=torch.channels_last)
    shapes: list[tuple[int, ...]] = []
    hooks = [
        m.register_forward_pre_hook(lambda _m, args: shapes.append(tuple(args[0].shape)))
        for m in network.modules()
        if isinstance(m, torch.nn.BatchNorm2d)
    ]
    images = torch.rand(batch, 3, imgsz, imgsz, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        network(images.contiguous(memory_format=torch.channels_last))
    for hook in hooks:
        hook.remove()
    return shapes


def layer_inputs(shapes, dtype):
    """Per layer: input (requires grad), output gradient, fp32 weight, bias, running stats."""
    layers = []
    for shape in shapes:
        x = torch.randn(shape, device="cuda", dtype=dtype).contiguous(
            memory_format=torch.channels_last
        )
        channels = shape[1]
        layers.append(
            {
                "x": x.requires_grad_(),
                "dy": torch.randn_like(x),
                "w": torch.rand(channels, device="cuda").requires_grad_(),
                "b": torch.randn(channels, device="cuda").requires_grad_(),
                "rm": torch.zeros(channels, device="cuda"),
                "rv": torch.ones(channels, device="cuda"),
            }
        )
    return layers


def native(layer):
    return F.batch_norm(
        layer["x"], layer["rm"], layer["rv"], layer["w"], layer["b"], True, MOMENTUM, EPS
    )


def cudnn(layer):
    out = torch.ops.aten.cudnn_batch_norm(
        layer["x"], layer["w"], layer["b"], layer["rm"], layer["rv"], True, MOMENTUM, EPS
    )
    return out[0]


def fwd_bwd(layers, fn) -> None:
    for layer in layers:
        out = fn(layer)
        grads = torch.autograd.grad(out, (layer["x"], layer["w"], layer["b"]), layer["dy"])
        del out, grads


def backend(layer) -> str:
    x = layer["x"]
    choice = torch._C._select_batch_norm_backend(
        x, layer["w"], layer["b"], layer["rm"], layer["rv"], True, EPS
    )
    return str(choice).rsplit(".", 1)[-1]


def agreement(layers) -> dict:
    """Largest difference of cuDNN's bf16 output and gradients from the native kernels'."""
    worst = {"out": 0.0, "dx": 0.0, "dw": 0.0}
    for layer in layers[:8]:
        got = []
        for fn in (native, cudnn):
            out = fn(layer)
            dx, dw, _ = torch.autograd.grad(out, (layer["x"], layer["w"], layer["b"]), layer["dy"])
            got.append((out.float(), dx.float(), dw))
        for key, a, b in zip(worst, got[0], got[1], strict=True):
            worst[key] = max(worst[key], (a - b).abs().max().item())
    return worst


def main() -> None:
    parser = kernel_parser(__doc__)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_batchnorm measures CUDA kernels; run it on the GPU machine")
    report = kernel_report(args, batches={})
    for batch in map(int, args.batch.split(",")):
        shapes = bn_shapes(args.model, batch, args.imgsz)
        row: dict = {"layers": len(shapes)}
        for name, dtype, fn in (
            ("native-bf16", torch.bfloat16, native),
            ("cudnn-bf16", torch.bfloat16, cudnn),
            ("fp16", torch.float16, native),
        ):
            layers = layer_inputs(shapes, dtype)
            try:
                row[name] = {
                    "backend": backend(layers[0]),
                    "ms": replay_ms(partial(fwd_bwd, layers, fn), args.warmup, args.repeats),
                }
            except RuntimeError as error:  # cuDNN may refuse bf16
                row[name] = {"failed": str(error).splitlines()[0]}
            if name == "cudnn-bf16" and "ms" in row[name]:
                row[name]["max_abs_diff_vs_native"] = agreement(layers)
            del layers
            torch.cuda.empty_cache()
        report["batches"][batch] = row
        print(batch, json.dumps(row))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
