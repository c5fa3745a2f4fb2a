"""Paired-run check of the CUDA-graph backends against eager, on a GPU.

    python tools/check_graphs.py --data .data/coco128/coco128.yaml --amp fp32,fp16,bf16 \\
        --steps 24 --out graphs-check.json

For each precision, the trainers start from the same state (same seed, same initial weights)
and train on the same batches (fetched once, kept on the host): eager, eager again (the
baseline: how far two eager runs already differ), cuda-graph twice (is a replay
deterministic run to run) and whole-step (and with ``--fuse PRECISIONS`` whole-step with
``fuse=inductor``, or another ``--fuse-mode``, twice: is the fused step deterministic run to
run). ``--strict`` turns on
``torch.use_deterministic_algorithms`` (warning where an op has no deterministic kernel).
Batch 16 with ``nbs=64`` accumulates 4 batches per optimizer step, so the gradient-
accumulation copy is on the path. Compared after every step's loss and at the end: weights,
EMA weights, optimizer state (bit-equal counts and the largest difference). Peak allocated
and reserved memory of each run are reported as the growth over what was held before it.

Then the failure path: a module with a host sync in its forward (``.item()``) cannot be
captured; after the failed capture the same process keeps training it eagerly, and its
outputs and gradients are compared bit for bit with an untouched copy trained eagerly, so
the report says whether falling back to eager in-process is safe.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import tempfile
import time
from pathlib import Path

import torch
from torch import nn


def build(keys: dict):
    from falconet.plugins import get_plugins
    from falconet.training.setup import plan_run
    from falconet.training.trainer import Trainer

    plugins = get_plugins()
    return Trainer(plan_run(keys, plugins), plugins)


def fetch_batches(trainer, steps: int) -> list[dict]:
    from falconet.data.loader import stop_workers

    batches: list[dict] = []
    while len(batches) < steps:
        for batch in trainer.train_loader:
            batches.append({k: v.clone() for k, v in batch.items() if torch.is_tensor(v)})
            if len(batches) == steps:
                break
    stop_workers(trainer.train_loader)  # not 5 s per worker at exit (torch 2.11)
    return batches


def train(trainer, batches: list[dict]) -> dict:
    from falconet.data.targets import TARGET_KEYS

    device = trainer.device
    cuda = device.type == "cuda"  # on the CPU only the script itself is checked
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    held = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) if cuda else (0, 0)
    losses = []
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        images = batch["images"].to(device).float().div_(255)
        targets = {k: batch[k].to(device) for k in TARGET_KEYS}
        update = (i + 1) % trainer.accumulate == 0
        loss, _ = trainer.train_batch(images, targets, optimizer_step=update)
        losses.append(loss.detach().float().clone())
    if cuda:
        torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()) if cuda else held
    return {
        "losses": torch.stack(losses).cpu(),
        "seconds": time.perf_counter() - start,
        "peak_allocated_mib": (peak[0] - held[0]) / 2**20,
        "peak_reserved_mib": (peak[1] - held[1]) / 2**20,
        "counts": dict(getattr(trainer.network, "counts", {})),
    }


def state_tensors(trainer) -> dict[str, torch.Tensor]:
    tensors = {f"model.{k}": v for k, v in trainer.model.state_dict().items()}
    if trainer.ema is not None:
        tensors.update({f"ema.{k}": v for k, v in trainer.ema.module.state_dict().items()})
    for i, state in enumerate(trainer.optimizer.state.values()):
        tensors.update({f"optim.{i}.{k}": v for k, v in state.items() if torch.is_tensor(v)})
    return tensors


def compare(a, b, run_a: dict, run_b: dict) -> dict:
    ta, tb = state_tensors(a), state_tensors(b)
    equal = sum(torch.equal(ta[k], tb[k]) for k in ta)
    worst = max(
        ((ta[k].double() - tb[k].double()).abs().max().item(), k)
        for k in ta
        if ta[k].numel() and ta[k].is_floating_point()
    )
    la, lb = run_a["losses"], run_b["losses"]
    return {
        "losses_equal": int((la == lb).sum()),
        "losses": len(la),
        "loss_max_abs_diff": float((la - lb).abs().max()),
        "tensors_equal": equal,
        "tensors": len(ta),
        "max_abs_diff": worst[0],
        "worst_tensor": worst[1],
    }


def paired_keys(args, amp: str, tmp: Path) -> dict:
    """The training keys every arm of a paired run shares (SGD, deterministic, one state)."""
    return dict(
        data=args.data,
        imgsz=args.imgsz,
        batch=args.batch,
        nbs=args.batch * 4,
        workers=2,
        cache="ram",
        amp_dtype=amp,
        val=False,
        plots=False,
        deterministic=True,
        close_mosaic=0,
        epochs=1,
        optimizer="sgd",
        project=str(tmp),
        exist_ok=True,
    )


def paired(args, amp: str, tmp: Path) -> dict:
    keys = paired_keys(args, amp, tmp)
    arms = [("eager", "eager", {}), ("eager2", "eager", {}), ("graph", "cuda-graph", {})]
    arms.append(("graph2", "cuda-graph", {}))  # is a replay itself run-to-run deterministic?
    arms.append(("whole", "whole-step", {}))  # fp16: the gradient scaler on the device
    if amp in args.fuse.split(","):
        fused = {"fuse": args.fuse_mode} | dict(k.split("=", 1) for k in args.fused_keys)
        arms.append(("fused", "whole-step", fused))
        arms.append(("fused2", "whole-step", fused))  # run to run
    trainers = {
        name: build({**keys, **extra, "graph": graph, "name": f"{amp}-{name}"})
        for name, graph, extra in arms
    }
    batches = fetch_batches(trainers["eager"], args.steps)
    runs = {name: train(trainer, batches) for name, trainer in trainers.items()}
    whole = {"losses_eager": runs["eager"]["losses"].tolist()} if "whole" in trainers else {}
    for name in ("whole", "fused"):
        if name not in trainers:
            continue
        runner = trainers[name].step_runner
        whole |= {
            f"{name}_used": trainers[name].graph,
            f"{name}_vs_eager": compare(
                trainers["eager"], trainers[name], runs["eager"], runs[name]
            ),
            f"{name}_counts": dict(runner.counts) if runner else {},
            f"{name}_failed_with": runner.failed if runner else None,
            f"losses_{name}": runs[name]["losses"].tolist(),
        }
    if "fused2" in trainers:
        whole["fused_vs_fused"] = compare(
            trainers["fused"], trainers["fused2"], runs["fused"], runs["fused2"]
        )
    return {
        **whole,
        "amp": amp,
        "graph_used": trainers["graph"].graph,
        "eager_vs_eager": compare(
            trainers["eager"], trainers["eager2"], runs["eager"], runs["eager2"]
        ),
        "graph_vs_eager": compare(
            trainers["eager"], trainers["graph"], runs["eager"], runs["graph"]
        ),
        "graph_vs_graph": compare(
            trainers["graph"], trainers["graph2"], runs["graph"], runs["graph2"]
        ),
        "memory_mib": {
            n: {
                "peak_allocated": round(r["peak_allocated_mib"]),
                "peak_reserved": round(r["peak_reserved_mib"]),
            }
            for n, r in runs.items()
        },
        "seconds": {n: round(r["seconds"], 2) for n, r in runs.items()},
        "graph_counts": runs["graph"]["counts"],
        "graph_failed_with": [
            str(v) for v in getattr(trainers["graph"].network, "failed", {}).values()
        ],
        "losses_graph": runs["graph"]["losses"].tolist(),
    }


class SyncingNet(nn.Module):
    """A host sync (``.item()``) in the forward: not capturable."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        y = self.bn(self.conv(x))
        scale = 1.0 if y.abs().max().item() < 1e6 else 0.5
        return y.relu().mean((2, 3)) * scale


def failed_capture() -> dict:
    from falconet_graphs_cuda.graphed import GraphedNetwork
    from falconet_graphs_cuda.recording import CudaRecorder

    torch.manual_seed(0)
    net = SyncingNet().cuda().train()
    twin = copy.deepcopy(net)
    graphed = GraphedNetwork(net, CudaRecorder())
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (net, twin)]
    equal_steps = 0
    steps = 8
    for i in range(steps):
        x = torch.randn(
            4, 3, 32, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(i)
        )
        outs = [graphed(x), twin(x)]
        for out, opt in zip(outs, optimizers, strict=True):
            (out**2).sum().backward()
            opt.step()
            opt.zero_grad()
        torch.cuda.synchronize()
        same = torch.equal(outs[0], outs[1]) and all(
            torch.equal(a, b)
            for a, b in zip(net.state_dict().values(), twin.state_dict().values(), strict=True)
        )
        equal_steps += same
    # the context still works for other CUDA work, graphs included
    other = torch.cuda.CUDAGraph()
    static = torch.ones(4, device="cuda")
    with torch.cuda.graph(other):
        out = static * 2
    other.replay()
    torch.cuda.synchronize()
    return {
        "steps": steps,
        "bit_equal_steps_after_failure": equal_steps,
        "counts": graphed.counts,
        "failure": next(iter(graphed.failed.values()), None),
        "later_capture_works": bool(torch.equal(out, torch.full((4,), 2.0, device="cuda"))),
    }


def full_runs(args, tmp: Path) -> list[dict]:
    """Each backend inside a real training run (loader, logging, callbacks): did it capture,
    how many batches replayed, and the run's img/s and losses."""
    from falconet import Detector

    out = []
    for graph in args.full_runs.split(","):
        detector = Detector("yolo-n")
        keys = dict(
            data=args.data,
            imgsz=args.imgsz,
            batch=args.batch,
            epochs=3,
            workers=8,
            cache="ram",
            amp_dtype="bf16",
            val=False,
            plots=False,
            optimizer="sgd",
            project=str(tmp),
            name=f"full-{graph}",
            exist_ok=True,
            graph=graph,
        )
        try:
            summary = detector.train(**keys)
            row = {"graph": graph, "used": summary["graph"]}
        except Exception as exc:  # one backend's failure must not lose the others
            out.append({"graph": graph, "error": f"{type(exc).__name__}: {exc}"})
            continue
        rows = (Path(summary["run_dir"]) / "results.csv").read_text().splitlines()
        row["results_csv"] = rows
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=".data/coco128/coco128.yaml")
    parser.add_argument("--amp", default="fp32,fp16,bf16")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument(
        "--full-runs", default="", help="graph backends to also train 3 epochs with: eager,..."
    )
    parser.add_argument(
        "--fuse", default="", help="precisions to also run whole-step with --fuse-mode in"
    )
    parser.add_argument(
        "--fuse-mode",
        default="inductor",
        choices=("none", "inductor", "inductor-loss", "inductor-all"),
        help="the fused arm's fuse key",
    )
    parser.add_argument(
        "--fused-keys",
        nargs="*",
        default=[],
        help="more config keys of the fused arms, key=value (e.g. bn_silu=triton)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="torch.use_deterministic_algorithms for every arm (warn where none exists)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.strict:
        torch.use_deterministic_algorithms(True, warn_only=True)
    tmp = Path(tempfile.mkdtemp(prefix="check-graphs-"))
    cuda = torch.cuda.is_available()
    report: dict = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
    }
    report["paired"] = []
    for amp in args.amp.split(","):
        result = paired(args, amp, tmp)
        report["paired"].append(result)
        print(json.dumps({k: v for k, v in result.items() if "losses" not in k}), flush=True)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    if args.full_runs:
        report["full_runs"] = full_runs(args, tmp)
        print(json.dumps(report["full_runs"]), flush=True)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    if cuda:  # last: if a failed capture broke the process, the paired results are saved
        report["failed_capture"] = failed_capture()
        print(json.dumps(report["failed_capture"]), flush=True)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
