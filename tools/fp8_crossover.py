"""Where FP8 starts to pay: one matrix product at a time, bf16 against FP8, by its size.

``amp_dtype=fp8`` converts a linear layer only where its FP8 product, forward and backward,
beats bf16 at the run's shape (docs/precision.md, gating). This measures the same thing for a
grid of shapes instead of a model's: ``rows`` (tokens: batch x sequence) by ``in -> out``
features, square widths and a transformer's feed-forward pair (``d -> 4d`` and ``4d -> d``),
each timed as the gating times it (``falconet_precision_te_fp8.te_modules.time_product``:
fp32 master weights under bf16 autocast against Transformer Engine's ``Linear`` under its FP8
autocast, CUDA-graph replays, the median of 7 x 20 passes). The speed-up is bf16's time over
FP8's; the gating converts a layer above 1.05.

    cd tools && python fp8_crossover.py --recipes current,delayed --out fp8-crossover.json

Needs a GPU of compute capability 8.9 or more and Transformer Engine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def shapes(widths: list[int], ffn_up_to: int) -> list[tuple[int, int]]:
    """``(in, out)`` pairs: every square width, and for widths up to ``ffn_up_to`` the
    feed-forward pair."""
    pairs = [(w, w) for w in widths]
    for w in widths:
        if w <= ffn_up_to:
            pairs += [(w, 4 * w), (4 * w, w)]
    return pairs


def table(results: list[dict], recipe: str, rows: list[int]) -> str:
    """Speed-ups of one recipe, a row per product shape and a column per ``rows``."""
    pairs = list(dict.fromkeys((r["in"], r["out"]) for r in results if r["recipe"] == recipe))
    lines = [
        f"fp8_recipe={recipe}: bf16 time / FP8 time (forward + backward, graph replays)",
        "| in -> out | " + " | ".join(f"{n:,} rows" for n in rows) + " |",
        "| --- |" + " --- |" * len(rows),
    ]
    for pair in pairs:
        cells = []
        for n in rows:
            hit = [
                r
                for r in results
                if r["recipe"] == recipe and (r["in"], r["out"]) == pair and r["rows"] == n
            ]
            cells.append(f"{hit[0]['speedup']:.2f}" if hit else "-")
        lines.append(f"| {pair[0]} -> {pair[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="4096,16384,65536")
    parser.add_argument("--widths", default="128,256,512,1024,2048,4096,8192")
    parser.add_argument("--ffn-up-to", type=int, default=1024, help="widths with a d->4d pair")
    parser.add_argument("--recipes", default="current,delayed")
    parser.add_argument("--out", default="fp8-crossover.json")
    args = parser.parse_args()

    import torch

    from falconet_precision_te_fp8.backend import te_version
    from falconet_precision_te_fp8.gating import Product
    from falconet_precision_te_fp8.te_modules import build_recipe, time_product

    if not torch.cuda.is_available():
        sys.exit("fp8_crossover.py: needs a CUDA GPU (compute capability 8.9 or more)")
    rows = [int(v) for v in args.rows.split(",")]
    pairs = shapes([int(v) for v in args.widths.split(",")], args.ffn_up_to)
    recipes = args.recipes.split(",")
    results = []
    for recipe in recipes:
        made = build_recipe(recipe)
        for n in rows:
            for fan_in, fan_out in pairs:
                start = time.perf_counter()
                timing = time_product(Product(n, fan_in, fan_out), made)
                results.append(
                    {
                        "recipe": recipe,
                        "rows": n,
                        "in": fan_in,
                        "out": fan_out,
                        "bf16_ms": round(timing.bf16_ms, 4),
                        "fp8_ms": round(timing.fp8_ms, 4),
                        "speedup": round(timing.speedup, 3),
                        "replayed": timing.replayed,
                        "seconds": round(time.perf_counter() - start, 2),
                    }
                )
                torch.cuda.empty_cache()
        print(table(results, recipe, rows), flush=True)
    out = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformer_engine": te_version(),
        "settings": vars(args),
        "results": results,
    }
    with open(args.out, "w") as file:
        json.dump(out, file, indent=1)


if __name__ == "__main__":
    main()
