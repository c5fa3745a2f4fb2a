"""Can detr-n memorise a few images? A CPU check of the DETR family's learning, between GPU calls.

The overfit check on the H200 (``bench_train.py --measures overfit``) is the accuracy record;
this script asks a smaller question that a CPU answers in minutes: trained on the first
``--images`` images of COCO128 with validation on the same images and the augmentation off
(mosaic, translation, scale, HSV and flips), how far does detr-n get in ``--epochs`` epochs?
A loss or recipe change that slows learning shows here first. Each arm (training keys over the
defaults below, ``;``-separated arms) and seed runs in a fresh process; the JSON records each
run's final mAP50-95 and mAP50 and its last logged losses.

    cd tools && OMP_NUM_THREADS=1 python detr_memorise.py --data ../.data/coco128 \\
        --arms "backbone_lr_scale=1.0;backbone_lr_scale=0.1" --seeds 0,1 --out memorise.json

Runs of one arm at a time; ``--parallel`` runs that many processes at once (one core each).
``--augment`` keeps the family recipe's augmentation (translation, scale, HSV, flips; detr's
recipe has no mosaic): then every sample differs from epoch to epoch and the check measures
learning rather than memorisation, nearer to what the overfit check on the H200 asks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

AUGMENTATION_OFF = ("translate", "scale", "hsv_h", "hsv_s", "hsv_v", "fliplr")

DEFAULTS = {
    "model": "detr-n",
    "batch": 8,
    "nbs": 8,
    "imgsz": 160,
    "workers": 0,
    "cache": "ram",
    "device": "cpu",
    "val": True,
    "plots": False,
    "warmup_epochs": 0,
    "mosaic": 0.0,
    "close_mosaic": 0,
    "translate": 0.0,
    "scale": 0.0,
    "hsv_h": 0.0,
    "hsv_s": 0.0,
    "hsv_v": 0.0,
    "fliplr": 0.0,
    "deterministic": False,
}


def subset(coco128: Path, images: int, out: Path) -> Path:
    """A dataset yaml of COCO128's first ``images`` training images, train = val (links)."""
    source = sorted((coco128 / "images" / "train2017").glob("*.jpg"))[:images]
    for kind in ("images", "labels"):
        (out / kind / "train").mkdir(parents=True, exist_ok=True)
    for image in source:
        (out / "images" / "train" / image.name).symlink_to(image)
        label = coco128 / "labels" / "train2017" / f"{image.stem}.txt"
        if label.exists():
            (out / "labels" / "train" / label.name).symlink_to(label)
    names = (coco128 / "coco128.yaml").read_text().split("names:", 1)[1]
    yaml = out / "memorise.yaml"
    yaml.write_text(f"path: {out}\ntrain: images/train\nval: images/train\nnames:{names}")
    return yaml


def child(keys: dict) -> dict:
    """One run in this process: its final metrics and last logged losses."""
    import torch

    torch.set_num_threads(1)
    from falconet.plugins import get_plugins
    from falconet.training.planning import plan_run
    from falconet.training.trainer import Trainer

    plugins = get_plugins()
    trainer = Trainer(plan_run(keys, plugins), plugins)
    summary = trainer.fit()
    return {
        "map50_95": summary["metrics"]["AP"],
        "map50": summary["metrics"]["AP50"],
        "losses": {k: v for k, v in trainer.state.logged.items() if k in ("vfl", "l1", "giou")},
    }


def parse_keys(arm: str) -> dict:
    keys = {}
    for pair in filter(None, (p.strip() for p in arm.split(":"))):
        key, value = pair.split("=", 1)
        keys[key] = json.loads(value) if value[:1] in "0123456789-[{tf" else value
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../.data/coco128"))
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--arms", default="", help="';'-separated arms of key=value:key=value")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument(
        "--augment", action="store_true", help="keep the recipe's augmentation (no mosaic)"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    tmp = Path(tempfile.mkdtemp(prefix="detr-memorise-"))
    yaml = subset(args.data.resolve(), args.images, tmp / "data")
    defaults = {k: v for k, v in DEFAULTS.items() if not (args.augment and k in AUGMENTATION_OFF)}
    runs = [
        (i, arm, int(seed))
        for i, (arm, seed) in enumerate(
            (arm, seed) for arm in args.arms.split(";") for seed in args.seeds.split(",")
        )
    ]

    def run(planned: tuple[int, str, int]) -> dict:
        index, arm, seed = planned
        keys = {**defaults, "data": str(yaml), "epochs": args.epochs, "seed": seed}
        keys.update(parse_keys(arm), project=str(tmp / "runs"), name=f"run{index}")
        keys["val_interval"] = args.epochs
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        done = subprocess.run(
            [sys.executable, __file__, "--out", str(args.out), "--child", json.dumps(keys)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            return {"arm": arm, "seed": seed, "error": done.stderr[-2000:]}
        result = json.loads(done.stdout.strip().splitlines()[-1])
        print(arm or "(defaults)", seed, result, file=sys.stderr, flush=True)
        return {"arm": arm, "seed": seed, **result}

    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(run, runs))
    settings = {k: str(v) for k, v in vars(args).items() if k != "child"}
    record = {"settings": settings, "defaults": defaults, "results": results}
    args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
