"""BatchNorm + SiLU for every Conv block of a family's network: PyTorch's kernels against the
fused Triton op (``bn_silu=triton``, falconet_graphs_cuda.bn_silu), time and error.

For each BatchNorm input of the network at ``--batch`` (shapes from one forward pass,
channels_last), the forward and backward of all layers are recorded as one CUDA graph and
replayed, as whole-step runs them; the median of ``--repeats`` replays after ``--warmup``, CUDA
events. Variants, per dtype: ``native`` (``F.silu(F.batch_norm(...))``: cuDNN's BatchNorm in
fp16, PyTorch's own in bf16, then SiLU) and ``triton``. The error of each, against the same
computation in float64 on the same inputs, is the largest absolute difference over every
layer, for the output, the input's gradient, the weight's and the bias's, and the running
statistics: the fused op should be no further from float64 than PyTorch's kernels are.

    python tools/bench_bn_silu.py --model yolo-n --batch 16,64 --out bn_silu.json

``--sweep`` times the Triton op alone under other tilings (``bn_silu_tiling.Tiling``), fp16, at each
batch, from the default: first the reductions' tile, warps and programs per SM
(``--reduce-elements``, ``--reduce-warps``, ``--per-sm``), then, from the best of those, the
elementwise kernels' tile and warps (``--map-elements``, ``--map-warps``); each row is the
same replayed forward and backward of all layers. Last, from the best of those, the merge
kernels' tile and channels a program (``--merge-elements``, ``--merge-channels``;
``--no-merge`` skips this stage).

``--per-shape`` then times every tiling the sweep tried on each distinct layer shape alone
(its forward and backward replayed, times the layers of that shape): the sum of each shape's
best against the best single tiling's sum says whether tilings chosen per shape would pay
before they are built.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from functools import partial

import torch
import torch.nn.functional as F
from bench_batchnorm import EPS, MOMENTUM, bn_shapes, layer_inputs  # tools/ is on the path
from graph_replay import kernel_parser, kernel_report, replay_ms

from falconet_graphs_cuda import bn_silu
from falconet_graphs_cuda.bn_silu import _BatchNormSiLU
from falconet_graphs_cuda.bn_silu_tiling import Tiling

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def native(layer, dtype=None):
    x = layer["x"] if dtype is None else layer["x"].to(dtype)
    args = (layer["rm"], layer["rv"], layer["w"], layer["b"])
    if dtype is not None:
        args = tuple(t.to(dtype) for t in args)
    return F.silu(F.batch_norm(x, *args, True, MOMENTUM, EPS))


def fused(layer):
    return _BatchNormSiLU.apply(
        layer["x"], layer["w"], layer["b"], layer["rm"], layer["rv"], MOMENTUM, EPS
    )


def fwd_bwd(layers, fn) -> None:
    for layer in layers:
        out = fn(layer)
        grads = torch.autograd.grad(out, (layer["x"], layer["w"], layer["b"]), layer["dy"])
        del out, grads


def errors(layers) -> dict:
    """Largest absolute error of each variant against float64, over all layers."""
    worst = {v: dict.fromkeys(("out", "dx", "dw", "db", "running_var"), 0.0) for v in VARIANTS}
    for layer in layers:
        reference = None
        for name, fn in (("float64", partial(native, dtype=torch.float64)), *VARIANTS.items()):
            layer["rm"].zero_()
            layer["rv"].fill_(1.0)
            out = fn(layer)
            got = torch.autograd.grad(out, (layer["x"], layer["w"], layer["b"]), layer["dy"])
            running_var = layer["rv"]
            if reference is None:  # float64 ran on copies of the statistics: PyTorch's formula
                unbiased = layer["x"].double().var(dim=(0, 2, 3), correction=1)
                running_var = 1.0 + MOMENTUM * (unbiased - 1.0)
            values = [t.double() for t in (out, *got, running_var)]
            if reference is None:
                reference = values
                continue
            for key, a, b in zip(worst[name], values, reference, strict=True):
                worst[name][key] = max(worst[name][key], (a - b).abs().max().item())
    return worst


VARIANTS = {"native": native, "triton": fused}


def sweep(shapes, args) -> list[dict]:
    """The Triton op's replayed time under each tiling (module docstring), fp16."""
    torch.manual_seed(0)
    layers = layer_inputs(shapes, torch.float16)
    work = partial(fwd_bwd, layers, fused)
    rows: list[dict] = []

    def timed(tiling: Tiling) -> float:
        bn_silu.TILING = tiling
        ms = replay_ms(work, args.warmup, args.repeats)
        rows.append({"tiling": asdict(tiling), "ms": ms})
        print(json.dumps(rows[-1]), flush=True)
        return ms

    best, best_ms = Tiling(), timed(Tiling())
    for elements in args.reduce_elements:
        for warps in args.reduce_warps:
            for per_sm in args.per_sm:
                tiling = Tiling(
                    **asdict(Tiling())
                    | {
                        "reduce_elements": elements,
                        "reduce_warps": warps,
                        "programs_per_sm": per_sm,
                    }
                )
                if tiling != Tiling() and (ms := timed(tiling)) < best_ms:
                    best, best_ms = tiling, ms
    reduce_best = best
    for elements in args.map_elements:
        for warps in args.map_warps:
            tiling = Tiling(
                **(asdict(reduce_best) | {"map_elements": elements, "map_warps": warps})
            )
            if tiling != reduce_best and (ms := timed(tiling)) < best_ms:
                best, best_ms = tiling, ms
    if args.merge:
        map_best = best
        for elements in args.merge_elements:
            for channels in args.merge_channels:
                change = {"merge_elements": elements, "merge_channels": channels}
                tiling = Tiling(**(asdict(map_best) | change))
                if tiling != map_best and (ms := timed(tiling)) < best_ms:
                    best, best_ms = tiling, ms
    bn_silu.TILING = Tiling()
    summary = {"best": asdict(best), "best_ms": best_ms, "default_ms": rows[0]["ms"]}
    if args.per_shape:
        tried = [Tiling(**row["tiling"]) for row in rows]
        summary["per_shape"] = per_shape(shapes, tried, best, args)
    return [summary, *rows]


def per_shape(shapes, tilings: list[Tiling], best: Tiling, args) -> dict:
    """Each distinct shape's replayed forward and backward under each tiling, times its count
    of layers: per shape the best, and the sums (module docstring)."""
    counts: dict[tuple[int, ...], int] = {}
    for shape in shapes:
        counts[tuple(shape)] = counts.get(tuple(shape), 0) + 1
    table = []
    for shape, count in counts.items():
        torch.manual_seed(0)
        layers = layer_inputs([shape], torch.float16)
        work = partial(fwd_bwd, layers, fused)
        times = {}
        for tiling in tilings:
            bn_silu.TILING = tiling
            times[tiling] = replay_ms(work, args.warmup, args.repeats) * count
        fastest = min(times, key=times.get)
        table.append(
            {
                "shape": shape,
                "layers": count,
                "best": asdict(fastest),
                "best_ms": times[fastest],
                "default_ms": times[Tiling()],
                "sweep_best_ms": times[best],
            }
        )
        print(json.dumps(table[-1]), flush=True)
    bn_silu.TILING = Tiling()
    return {
        "shapes": table,
        "sum_per_shape_best_ms": sum(row["best_ms"] for row in table),
        "sum_sweep_best_ms": sum(row["sweep_best_ms"] for row in table),
        "sum_default_ms": sum(row["default_ms"] for row in table),
    }


def main() -> None:
    parser = kernel_parser(__doc__)
    parser.add_argument("--dtypes", default="fp16,bf16")
    parser.add_argument("--sweep", action="store_true", help="time other tilings (docstring)")
    ints = lambda text: [int(v) for v in text.split(",")]  # noqa: E731
    parser.add_argument("--reduce-elements", type=ints, default=[2048, 4096, 8192, 16384])
    parser.add_argument("--reduce-warps", type=ints, default=[4, 8])
    parser.add_argument("--per-sm", type=ints, default=[2, 4, 8])
    parser.add_argument("--map-elements", type=ints, default=[1024, 2048, 4096, 8192])
    parser.add_argument("--map-warps", type=ints, default=[2, 4, 8])
    parser.add_argument("--merge-elements", type=ints, default=[2048, 4096, 8192])
    parser.add_argument("--merge-channels", type=ints, default=[16, 32, 64])
    parser.add_argument(
        "--no-merge", dest="merge", action="store_false", help="skip the sweep's merge stage"
    )
    parser.add_argument(
        "--per-shape", action="store_true", help="after a sweep: each shape's best (docstring)"
    )
    args = parser.parse_args()
    if args.per_shape and not args.sweep:
        parser.error("--per-shape times the tilings a --sweep tried: give both")
    if not torch.cuda.is_available():
        raise SystemExit("bench_bn_silu measures CUDA kernels; run it on the GPU machine")
    import triton

    report = kernel_report(args, triton=triton.__version__, rows=[])
    for batch in map(int, args.batch.split(",")):
        shapes = bn_shapes(args.model, batch, args.imgsz)
        if args.sweep:
            report.setdefault("sweep", {})[batch] = sweep(shapes, args)
            print(json.dumps(report["sweep"][batch][0]), flush=True)
            continue
        for dtype_name in args.dtypes.split(","):
            torch.manual_seed(0)
            layers = layer_inputs(shapes, DTYPES[dtype_name])
            row = {"batch": batch, "dtype": dtype_name, "layers": len(shapes)}
            for name, fn in VARIANTS.items():
                work = partial(fwd_bwd, layers, fn)
                row[f"{name}_ms"] = replay_ms(work, args.warmup, args.repeats)
            row["speedup"] = row["native_ms"] / row["triton_ms"]
            row["max_abs_error_vs_float64"] = errors(layers)
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
            del layers
            torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
