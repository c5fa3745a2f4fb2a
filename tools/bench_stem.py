"""The stem convolution (3 input channels) against the same convolution on an input padded
with zero channels to 4 or 8: time, kernels, and error against float64.

cuDNN runs a 3-channel convolution on its kernels for odd channel counts, which stage no
tiles in shared memory (``..._indexed_wo_smem_...`` in the fused fp16 step's profile,
docs/bench-results/2026-12-01-profile-fused-fp16-b16-kinds-kernels.txt: about 80 us
forward and 205 us weight gradient at batch 16, one call each a step: the stem is the one
3-channel convolution, and the weight gradient the step's largest single kernel). Zero
channels with zero weights add nothing to the sum, so a padded stem computes the same
convolution; whether cuDNN then picks its faster kernels, and what the padding costs, is
what this measures before the family or the data pipeline change (docs/performance.md,
"Not done yet").

For each batch and dtype, the stem's forward and weight gradient (the images need no
gradient), recorded as a CUDA graph and replayed (median of ``--repeats`` after
``--warmup``), as whole-step runs them. Variants: ``c3`` as today; ``c4`` and ``c8``, the
input already padded (a static buffer whose zero channels are written once) and the weight
padded inside the step (``F.pad``, whose backward slices the gradient back); ``c4-copy``,
``c4`` that also copies the 3-channel images into the padded buffer each step. Kernels: the
CUDA kernels of one call, from torch's profiler. Error: the largest absolute difference of
the output and the weight's gradient from float64 on the same rounded inputs.

    python tools/bench_stem.py --model yolo-n --batch 16,64 --out stem.json
"""

from __future__ import annotations

import json
from functools import partial

import torch
import torch.nn.functional as F
from graph_replay import kernel_parser, kernel_report, replay_ms  # tools/ is on the path

from falconet.plugins import get_plugins

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
PADDED = {"c3": 3, "c4": 4, "c4-copy": 4, "c8": 8}


def stem(model: str) -> torch.nn.Conv2d:
    """The network's first convolution, the one that reads the images."""
    network = get_plugins().families.get(model).build_model(model, 80)
    return next(m for m in network.modules() if isinstance(m, torch.nn.Conv2d))


def inputs(conv: torch.nn.Conv2d, batch: int, imgsz: int, dtype: torch.dtype) -> dict:
    """Images in ``[0, 1]``, the weight, and an output gradient, on the GPU, channels_last."""
    cl = torch.channels_last
    x = torch.rand(batch, conv.in_channels, imgsz, imgsz, device="cuda").to(dtype)
    w = conv.weight.detach().to("cuda", dtype).contiguous(memory_format=cl)
    out_shape = F.conv2d(x[:1], w, None, conv.stride, conv.padding).shape[1:]
    dy = torch.randn(batch, *out_shape, device="cuda").to(dtype).contiguous(memory_format=cl)
    return {"x": x.contiguous(memory_format=cl), "w": w.requires_grad_(), "dy": dy}


def padded_input(x: torch.Tensor, channels: int) -> torch.Tensor:
    """``x`` with zero channels after its own, channels_last."""
    n, c, h, w = x.shape
    out = x.new_zeros(n, channels, h, w).contiguous(memory_format=torch.channels_last)
    out[:, :c].copy_(x)
    return out


def step(conv: torch.nn.Conv2d, data: dict, variant: str, x_padded: torch.Tensor | None):
    """One forward and weight gradient of the variant; returns the output and the gradient."""
    w, x = data["w"], data["x"]
    if variant != "c3":
        if variant == "c4-copy":
            x_padded[:, : x.shape[1]].copy_(x)
        x = x_padded
        w = F.pad(w, (0, 0, 0, 0, 0, x.shape[1] - w.shape[1]))
    out = F.conv2d(x, w, None, conv.stride, conv.padding)
    (grad,) = torch.autograd.grad(out, data["w"], data["dy"])
    return out, grad


def kernels(fn) -> list[dict]:
    """The CUDA kernels of one call of ``fn`` and their microseconds."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [
        {"name": e.name[:120], "us": round(e.device_time, 1)}
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    ]


def errors(conv, data, got) -> dict:
    """Largest absolute error of the output and the weight's gradient against float64."""
    x, w, dy = (data[k].detach().double() for k in ("x", "w", "dy"))
    w.requires_grad_()
    out = F.conv2d(x, w, None, conv.stride, conv.padding)
    (grad,) = torch.autograd.grad(out, w, dy)
    return {
        "out": (got[0].double() - out).abs().max().item(),
        "dw": (got[1].double() - grad).abs().max().item(),
    }


def main() -> None:
    parser = kernel_parser(__doc__)
    parser.add_argument("--dtypes", default="fp16,bf16")
    parser.add_argument("--variants", default=",".join(PADDED))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_stem measures cuDNN's kernels; run it on the GPU machine")
    torch.backends.cudnn.benchmark = True  # as the trainer runs
    conv = stem(args.model)
    report = kernel_report(args, stem=repr(conv), rows=[])
    for batch in map(int, args.batch.split(",")):
        for dtype_name in args.dtypes.split(","):
            torch.manual_seed(0)
            data = inputs(conv, batch, args.imgsz, DTYPES[dtype_name])
            for variant in args.variants.split(","):
                x_padded = None if variant == "c3" else padded_input(data["x"], PADDED[variant])
                work = partial(step, conv, data, variant, x_padded)
                row = {"batch": batch, "dtype": dtype_name, "variant": variant}
                row["ms"] = replay_ms(work, args.warmup, args.repeats)
                row["kernels"] = kernels(work)
                row["max_abs_error_vs_float64"] = errors(conv, data, work())
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
                del x_padded
            del data
            torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
