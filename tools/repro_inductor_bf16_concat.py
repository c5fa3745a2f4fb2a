"""Does Inductor compute the YOLO head's concatenation right in bf16? A minimal reproduction.

The pattern is the detection head's: per pyramid level, a convolution of a channels_last bf16
feature map, flattened over space (``flatten(2)``), and the levels concatenated along that
axis. On the CPU with torch 2.15, Inductor's compiled function returns values the eager one
does not, different from run to run and often not finite (uninitialised memory), while fp32,
or bf16 without the convolution, is right. That is why ``graph=compile`` declines bf16 on the
CPU (falconet.compile_dispatch). Run it on a GPU to see whether CUDA is affected too (it is
where ``fuse=inductor`` trained to a lower mAP, docs/performance.md).

    python tools/repro_inductor_bf16_concat.py --device cpu

Exit status 1 when the compiled values differ from eager beyond bf16 rounding.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

LEVELS = ((64, 32), (128, 16), (256, 8))  # yolo-n at 256 px: channels and side per level


def head(features, convs):
    return torch.cat([c(x).flatten(2) for c, x in zip(convs, features, strict=True)], 2)


def compare(device: str, dtype: torch.dtype, batch: int) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    convs = torch.nn.ModuleList(torch.nn.Conv2d(c, 64, 1) for c, _ in LEVELS).to(device, dtype)
    features = [
        torch.randn(batch, c, s, s, device=device, dtype=dtype).contiguous(
            memory_format=torch.channels_last
        )
        for c, s in LEVELS
    ]
    with torch.no_grad():
        eager = head(features, convs).float()
        compiled = torch.compile(head, dynamic=False)(features, convs).float()
    finite = torch.isfinite(compiled)
    gap = (compiled[finite] - eager[finite]).abs().max().item() if finite.any() else None
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "elements": compiled.numel(),
        "not_finite": int((~finite).sum()),
        "max_abs_diff_where_finite": gap,
        "eager_max_abs": eager.abs().max().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    rows = [compare(args.device, dtype, args.batch) for dtype in (torch.float32, torch.bfloat16)]
    print(json.dumps({"torch": torch.__version__, "device": args.device, "rows": rows}, indent=1))
    wrong = any(
        r["not_finite"] or (r["max_abs_diff_where_finite"] or 0) > 0.05 * r["eager_max_abs"]
        for r in rows
    )
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
