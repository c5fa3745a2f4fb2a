"""Parameters and FLOPs of falconet's DETR models and RF-DETR Nano, counted one way for all.

    uv run python tools/count_flops.py --out flops.json
    uv run python tools/count_flops.py --rfdetr-python /tmp/rfvenv/bin/python --out flops.json
    uv run python tools/count_flops.py --query-groups 1,3,13 --out groups.json

One counter for every model: ``torch.utils.flop_counter.FlopCounterMode`` over one eval-mode
forward of a batch of one zero image at ``--imgsz`` (384), on the CPU, in float32, 80 classes,
random weights. The counter counts matrix products (``mm``, ``addmm``, ``bmm``), convolutions
and scaled-dot-product attention (its two products), a multiply-add counting 2; it counts no
elementwise op, normalisation or softmax, for any model alike. It has no formula for
``grid_sample``, the bilinear sampling of deformable attention, which all three use (RF-DETR's
CPU path is ``F.grid_sample`` too); this script gives it one, through the same counter's
``custom_mapping``, and reports the totals with and without it:

    grid_sample FLOPs = 8 x N x C x H_out x W_out

four taps a sampled value and channel, each a multiply and an add; the taps' weights and
indices (per point, not per channel) are left out. The attention-weighted sum of the samples
is elementwise and not counted, as everywhere else.

RF-DETR comes from Roboflow's ``rfdetr`` package (1.11.2 measured), never a falconet
dependency: install it into a throwaway environment with this workspace's torch
(``uv venv /tmp/rfvenv && uv pip install --python /tmp/rfvenv/bin/python rfdetr==1.11.2
torch==<the workspace's>``) and name its interpreter with ``--rfdetr-python``; this script then
runs itself there for RF-DETR alone (its counting needs only torch) and refuses a torch version
that differs from this one's. Nano is built from its config with ``pretrain_weights=None``
(random init, no checkpoint download) and its hub access switched off, so nothing is fetched.
Where ``rfdetr`` imports in this interpreter it is counted here; where neither, only
falconet's models are counted and the output says so.

``--query-groups 1,3,13``: instead, falconet's models' *training* forward (the network alone:
no denoising pass, loss or backward) with that many query groups (the ``query_groups`` key),
what Group DETR adds to a training step's network; inference is the one-group count above.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten

FALCONET_MODELS = ("detr-n", "detr-s")
RFDETR = "rfdetr-nano"
METHOD = (
    "torch.utils.flop_counter.FlopCounterMode, eval-mode forward, batch 1, float32, CPU, "
    "random init, 80 classes; a multiply-add counts 2; matmul, convolution and "
    "scaled-dot-product attention counted; grid_sample counted as 8 x N x C x H_out x W_out "
    "(4 bilinear taps x multiply-add per sampled value and channel) in the 'with sampling' "
    "column only; elementwise ops, norms and softmax not counted"
)


def grid_sample_flops(input_shape, grid_shape, *args, out_shape=None, **kwargs) -> int:
    """Bilinear ``grid_sample``: 4 taps, a multiply and an add each, per output value."""
    n, c = input_shape[:2]
    h_out, w_out = grid_shape[1:3]
    return 8 * n * c * h_out * w_out


SAMPLING_OPS = {aten.grid_sampler_2d: grid_sample_flops}


def count(model: torch.nn.Module, imgsz: int, training: bool = False) -> dict[str, Any]:
    """Parameters and FLOPs (with and without the sampling term) of one eval forward (with
    ``training``, of one training-mode forward)."""
    model = model.train(training).requires_grad_(False)  # the counter's hooks want no leaves
    params = sum(p.numel() for p in model.parameters())
    counter = FlopCounterMode(display=False, custom_mapping=SAMPLING_OPS)
    with counter, torch.no_grad():
        model(torch.zeros(1, 3, imgsz, imgsz))
    by_op = {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
    sampling = sum(v for k, v in by_op.items() if "grid_sampler" in k)
    total = counter.get_total_flops()
    return {
        "params": params,
        "params_m": round(params / 1e6, 2),
        "gflops_without_sampling": round((total - sampling) / 1e9, 2),
        "gflops_sampling": round(sampling / 1e9, 3),
        "gflops_with_sampling": round(total / 1e9, 2),
        "flops_by_op": by_op,
    }


def falconet_model(name: str, query_groups: int = 1) -> torch.nn.Module:
    from falconet_detr.family import DetrFamily

    return DetrFamily(query_groups).build_model(name, 80)


def count_groups(groups: list[int], imgsz: int) -> list[dict[str, Any]]:
    """falconet's models' training forward with each of ``groups`` query groups."""
    return [
        {
            "model": name,
            "source": "falconet-detr",
            "query_groups": g,
            "forward": "training",
            **count(falconet_model(name, g), imgsz, training=True),
        }
        for name in FALCONET_MODELS
        for g in groups
    ]


def rfdetr_nano(imgsz: int) -> tuple[torch.nn.Module, str]:
    """RF-DETR Nano, random init, built from its config offline (no weights fetched)."""
    import importlib.metadata

    home = tempfile.mkdtemp(prefix="rfdetr-home-")
    os.environ.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", RF_HOME=home
    )
    from rfdetr.config import RFDETRNanoConfig
    from rfdetr.models.lwdetr import build_model_from_config

    config = RFDETRNanoConfig(pretrain_weights=None, num_classes=80, resolution=imgsz)
    return build_model_from_config(config), importlib.metadata.version("rfdetr")


def count_rfdetr(imgsz: int) -> dict[str, Any]:
    model, version = rfdetr_nano(imgsz)
    return {"model": RFDETR, "source": f"rfdetr {version}", **count(model, imgsz)}


def rfdetr_elsewhere(python: str, imgsz: int) -> dict[str, Any]:
    """RF-DETR counted by this script under ``python`` (an environment with ``rfdetr``)."""
    done = subprocess.run(
        [python, __file__, "--only-rfdetr", "--imgsz", str(imgsz)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{python}: counting RF-DETR failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["torch"] != torch.__version__:
        raise SystemExit(
            f"{python} runs torch {result['torch']}, this one {torch.__version__}: the counter "
            "must be the same for every model; install this torch there"
        )
    return result["model"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imgsz", type=int, default=384)
    parser.add_argument("--rfdetr-python", help="an interpreter whose environment has rfdetr")
    parser.add_argument(
        "--query-groups",
        help="comma-separated group counts: count falconet's training forward with each",
    )
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--only-rfdetr", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 8)))
    if args.only_rfdetr:  # the child run: one JSON line on stdout
        print(json.dumps({"torch": torch.__version__, "model": count_rfdetr(args.imgsz)}))
        return
    note = None
    if args.query_groups:
        groups = [int(g) for g in args.query_groups.split(",")]
        models = count_groups(groups, args.imgsz)
        note = "training-mode forward of the network alone (no denoising pass, loss, backward)"
    else:
        models = [
            {"model": name, "source": "falconet-detr", **count(falconet_model(name), args.imgsz)}
            for name in FALCONET_MODELS
        ]
        try:
            import rfdetr  # noqa: F401
        except ImportError:
            if args.rfdetr_python:
                models.append(rfdetr_elsewhere(args.rfdetr_python, args.imgsz))
            else:
                note = "rfdetr is not installed here and no --rfdetr-python was given: "
                note += "falconet only"
        else:
            models.append(count_rfdetr(args.imgsz))
    result = {
        "tool": "tools/count_flops.py",
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "device": "cpu",
        "imgsz": args.imgsz,
        "batch": 1,
        "method": METHOD,
        "models": models,
    }
    if note:
        result["note"] = note
    print(f"{'model':<16} {'params':>9} {'GFLOPs':>8} {'+sampling':>10}  (at {args.imgsz} px)")
    for m in models:
        label = m["model"] + (f" G={m['query_groups']}" if "query_groups" in m else "")
        print(
            f"{label:<16} {m['params_m']:>8.2f}M {m['gflops_without_sampling']:>8.2f} "
            f"{m['gflops_with_sampling']:>10.2f}"
        )
    if note:
        print(note)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
