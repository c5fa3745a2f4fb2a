"""Paired-run check of the CUDA-graph backends against eager, on a GPU, with real updates.

    python tools/check_graphs.py --data .data/coco128/coco128.yaml --amp fp32,fp16,bf16 \\
        --steps 24 --strict --out graphs-check.json

For each precision, the trainers start from the same state (same seed, same initial weights)
and train on the same batches (fetched once, kept on the host): eager, eager again (the
baseline: how far two eager runs already differ), cuda-graph twice (is a replay
deterministic run to run) and whole-step (and with ``--fuse PRECISIONS`` whole-step with
``fuse=inductor``, or another ``--fuse-mode``, twice: is the fused step deterministic run to
run). ``--strict`` turns on ``torch.use_deterministic_algorithms`` (warning where an op has no
deterministic kernel). Batch 16 with ``nbs=64`` accumulates 4 batches per optimizer step, so
the gradient-accumulation copy is on the path.

**Real updates.** fp16's gradient scaler starts at 2**16, where every update of the first
~30 batches overflows and is skipped, so a check of that length compared runs whose weights
never moved. Every arm's scaler here starts at ``--init-scale`` (256) instead, set through
``GradScaler``'s public ``state_dict``/``load_state_dict`` before the first batch, and the
updates step. One update window (``--overflow-window``, the 2nd) is made to overflow on
purpose: its scale is set to 2**40 before its first batch and put back to ``--init-scale``
after its update, so the skipped-step path (eager's host-side skip, whole-step's on-device
no-op) is compared too. Each arm counts the updates that changed its weights (any trained
parameter not bit-equal to before the update); the check FAILS (exit status 1, verdict
``FAIL``) when, in an arm, fewer than ``--min-updated`` (3/4) of the updates not forced to
overflow changed the weights, or the forced overflow did not leave them as they were.

**Compared**, for each pair (eager/eager2, graph/eager, graph/graph2, whole/eager,
fused/eager, fused/fused2): every batch's loss; after every accumulating batch (not an
update), the accumulated gradients (``param.grad``: under whole-step its static buffers,
which are the parameters' ``.grad``); after every update, the trained weights; at the end,
every tensor of the weights, EMA weights and optimizer state. Each as the count bit-equal
(NaN where NaN counts as equal) and the largest absolute and relative difference. Peak
allocated and reserved memory of each run are reported as the growth over what was held
before it. The verdict lines (printed last, and under ``verdict`` in ``--out``) are what an
A/B of two commits compares.

Then the failure path: a module with a host sync in its forward (``.item()``) cannot be
captured; after the failed capture the same process keeps training it eagerly, and its
outputs and gradients are compared bit for bit with an untouched copy trained eagerly, so
the report says whether falling back to eager in-process is safe.

**Under DDP** (``--ddp``): every arm runs as a distributed run's step does, over a one-process
NCCL group (Gloo on the CPU): eager and cuda-graph call the network through
``DistributedDataParallel`` (cuda-graph's replays hand their gradients to DDP's reducer, whose
all-reduce runs outside the recording), and whole-step records the gradients' all-reduce and
the buffers' broadcast inside its update graph, agreeing on each batch's key over a Gloo group;
the pairs say whether each is bit for bit eager DDP. On a machine with N GPUs, ``torchrun
--nproc-per-node N`` runs the same arms distributed (each rank its share of every batch; rank
0 reports).

On the CPU (``--device cpu``, or no GPU) only the script itself is checked: the graph
backends decline and run eagerly, fp16 (CUDA only) is left out, and there is no memory
figure or failed-capture test.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import logging
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

FORCED_SCALE = 2.0**40  # the forced overflow's scale: any fp16 gradient of the loss overflows


# ------------------------------------------------------------------------------------------
# An arm: a trainer, seen through its run's parts (``trainer.run``) and its step
# ------------------------------------------------------------------------------------------
class Arm:
    """One trainer of a paired run: its run's parts (``trainer.run``) and its step
    (``run.step``, a :class:`~falconet.contract.TrainStep`)."""

    def __init__(self, keys: dict, ddp: bool = False) -> None:
        from falconet.plugins import get_plugins
        from falconet.training.planning import plan_run
        from falconet.training.trainer import Trainer

        plugins = get_plugins()
        self.trainer = Trainer(plan_run(keys, plugins), plugins)
        self.run = self.trainer.run
        if ddp:
            replicate_step(self.trainer, plugins)

    # the parts a step is made of
    @property
    def device(self) -> torch.device:
        return self.run.device

    @property
    def accumulate(self) -> int:
        return int(self.run.accumulate)

    @property
    def model(self) -> nn.Module:
        return self.run.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.run.optimizer

    @property
    def ema_module(self) -> nn.Module | None:
        return None if self.run.ema is None else self.run.ema.module

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The fp16 gradient scaler (a ``torch.amp.GradScaler`` subclass), or None."""
        scaler = self.run.scaler
        return scaler if scaler is not None and scaler.is_enabled() else None

    @property
    def loader(self):
        return self.run.train_loader

    @property
    def called_through(self) -> str:
        """The type of what the step calls as its network (DistributedDataParallel under
        ``--ddp``), or ``-`` for a step that holds none (whole-step calls the model itself)."""
        network = getattr(self.run.step, "network", None)
        return "-" if network is None else type(network).__name__

    @property
    def used(self) -> str:
        """The graph backend that runs (one that declines runs eager)."""
        return str(self.run.graph)

    def capture_stats(self) -> dict:
        """What the backend counted (recorded, replayed, eager batches; its failure): the
        step's ``stats()``."""
        import dataclasses

        found = dataclasses.asdict(self.run.step.stats())
        return {"step": {k: v for k, v in found.items() if _plain(v)}}

    # the scaler, through GradScaler's public API
    def scale(self) -> float | None:
        return None if self.scaler is None else float(self.scaler.get_scale())

    def set_scale(self, scale: float) -> None:
        """The scaler's scale (growth tracker kept), in place: a recorded step that reads the
        scale's device tensor reads the new one."""
        if self.scaler is not None:
            self.scaler.load_state_dict({**self.scaler.state_dict(), "scale": float(scale)})

    # a batch
    def step(self, batch: dict, update: bool) -> torch.Tensor:
        """One batch (forward, loss, backward; the optimizer step and EMA if ``update``), as
        the training loop runs it; returns the loss (a device tensor)."""
        from falconet.data.targets import Targets

        device = self.device
        images = batch["images"].to(device).float().div_(255)
        targets = Targets.from_batch(batch).to(device)
        return self.run.step(images, targets, update=update).loss


def replicate_step(trainer: Any, plugins: Any) -> None:
    """Rebuild ``trainer``'s step with its network called through DDP (``--ddp``): a one-process
    run's parts with the distributed run's ``replicate``, built by the same graph backend."""
    import dataclasses

    from falconet.training.assembly import graph_context
    from falconet.training.collectives import RankCollectives
    from falconet.training.distributed import World, replicate

    run = trainer.run
    if run.parts.replicate is not None:  # already distributed (torchrun with several ranks)
        return
    collectives = RankCollectives(1, _host_group())
    run.parts = dataclasses.replace(
        run.parts,
        replicate=functools.partial(replicate, device=run.device),
        collectives=collectives,
    )
    context = graph_context(run.family, plugins, run.config, run.parts, World())
    run.step = plugins.graph_backends.get(run.graph).build_step(run.parts, context)


@functools.cache
def _host_group() -> Any:
    """One Gloo group beside the one-process group, for every arm's host agreements (a new
    group per arm would connect a new Gloo mesh each time)."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo")


def start_one_process_group(device: torch.device) -> None:
    """A process group of this process alone (``--ddp`` without torchrun)."""
    import os

    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=0, world_size=1)


def _plain(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool, type(None)))


# ------------------------------------------------------------------------------------------
# The paired runs
# ------------------------------------------------------------------------------------------
def fetch_batches(arm: Arm, steps: int) -> list[dict]:
    from falconet.data.loader import stop_workers

    batches: list[dict] = []
    while len(batches) < steps:
        for batch in arm.loader:
            batches.append({k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()})
            if len(batches) == steps:
                break
    stop_workers(arm.loader)  # not 5 s per worker at exit (torch 2.11)
    return batches


def trained(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def flat_weights(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float() for p in trained(model)]).cpu()


def flat_grads(model: nn.Module) -> torch.Tensor:
    """The accumulated gradients of the trained parameters, one flat host tensor (a missing
    ``.grad`` reads as zeros)."""
    parts = [
        (p.grad.detach() if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
        for p in trained(model)
    ]
    return torch.cat(parts).cpu()


def train(arm: Arm, batches: list[dict], args) -> dict:
    """Train ``arm`` on ``batches``; the losses, the gradients after every accumulating batch,
    the weights after every update, and which updates changed the weights."""
    device = arm.device
    cuda = device.type == "cuda"  # on the CPU only the script itself is checked
    arm.set_scale(args.init_scale)
    scaled = arm.scaler is not None
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    held = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) if cuda else (0, 0)
    losses, grads, weights, updated, scales = [], [], [], [], []
    before = flat_weights(arm.model)
    accumulate = arm.accumulate
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        window = i // accumulate + 1  # 1-based update window
        forced = scaled and window == args.overflow_window
        if forced and i % accumulate == 0:
            arm.set_scale(FORCED_SCALE)
        update = (i + 1) % accumulate == 0
        loss = arm.step(batch, update)
        losses.append(loss.detach().float().clone())
        if not update:
            grads.append(flat_grads(arm.model))
            continue
        after = flat_weights(arm.model)
        weights.append(after)
        updated.append(not torch.equal(after, before))
        scales.append(arm.scale())
        before = after
        if forced:
            arm.set_scale(args.init_scale)
    if cuda:
        torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()) if cuda else held
    forced_window = args.overflow_window if scaled and args.overflow_window <= len(updated) else 0
    return {
        "losses": torch.stack(losses).cpu(),
        "grads": grads,
        "weights": weights,
        "updates": {
            "steps": len(updated),
            "updated": sum(updated),
            "changed": updated,
            "forced_overflow_window": forced_window or None,
            "scales_after": scales if scaled else None,
        },
        "seconds": time.perf_counter() - start,
        "peak_allocated_mib": (peak[0] - held[0]) / 2**20,
        "peak_reserved_mib": (peak[1] - held[1]) / 2**20,
        "counts": arm.capture_stats(),
    }


def state_tensors(arm: Arm) -> dict[str, torch.Tensor]:
    tensors = {f"model.{k}": v for k, v in arm.model.state_dict().items()}
    if arm.ema_module is not None:
        tensors.update({f"ema.{k}": v for k, v in arm.ema_module.state_dict().items()})
    for i, state in enumerate(arm.optimizer.state.values()):
        tensors.update({f"optim.{i}.{k}": v for k, v in state.items() if torch.is_tensor(v)})
    return tensors


def same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal values, or NaN in both (so an overflowed step's NaNs compare)."""
    if not a.is_floating_point():
        return a == b
    return (a == b) | (a.isnan() & b.isnan())


def difference(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, float, float]:
    """Bit-equal (as :func:`same`), the largest absolute difference and that over the
    largest magnitude of ``a`` (``inf``/``nan`` where one side is not finite and the other
    is, or differs)."""
    if a.shape != b.shape:
        return False, math.inf, math.inf
    if not a.numel():
        return True, 0.0, 0.0
    equal = same(a, b)
    if bool(equal.all()):
        return True, 0.0, 0.0
    a64, b64 = a.double(), b.double()
    worst = float(torch.where(equal, 0.0, (a64 - b64).abs()).max())
    scale = float(a64.nan_to_num(0.0, 0.0, 0.0).abs().max())
    return False, worst, worst / scale if scale else math.inf


def series(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict:
    """Snapshot by snapshot: how many are bit-equal, the largest differences, the first that
    differs (0-based)."""
    out = {"equal": 0, "of": min(len(a), len(b)), "max_abs_diff": 0.0, "max_rel_diff": 0.0}
    first = None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        equal, worst, rel = difference(x, y)
        out["equal"] += equal
        if not equal and first is None:
            first = i
        out["max_abs_diff"] = max(out["max_abs_diff"], worst)
        out["max_rel_diff"] = max(out["max_rel_diff"], rel)
    out["first_unequal"] = first
    if len(a) != len(b):
        out["lengths"] = [len(a), len(b)]
    return out


def compare(a: Arm, b: Arm, run_a: dict, run_b: dict) -> dict:
    ta, tb = state_tensors(a), state_tensors(b)
    equal, worst, where = 0, 0.0, None
    for k in ta:
        same_k, diff, _ = difference(ta[k], tb[k]) if k in tb else (False, math.inf, 0.0)
        equal += same_k
        if ta[k].is_floating_point() and (where is None or diff > worst):
            worst, where = diff, k
    la, lb = run_a["losses"], run_b["losses"]
    return {
        "losses_equal": int(same(la, lb).sum()),
        "losses": len(la),
        "loss_max_abs_diff": float((la - lb).abs().max()),
        "grads": series(run_a["grads"], run_b["grads"]),
        "weights_per_update": series(run_a["weights"], run_b["weights"]),
        "tensors_equal": equal,
        "tensors": len(ta),
        "max_abs_diff": worst,
        "worst_tensor": where,
    }


def paired_keys(args, amp: str, tmp: Path) -> dict:
    """The training keys every arm of a paired run shares (SGD, deterministic, one state)."""
    keys = dict(
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
    if args.device:
        keys["device"] = args.device
    return keys | dict(k.split("=", 1) for k in args.keys)


PAIRS = (  # (name, arm, reference): what the report compares
    ("eager_vs_eager", "eager2", "eager"),
    ("graph_vs_eager", "graph", "eager"),
    ("graph_vs_graph", "graph2", "graph"),
    ("whole_vs_eager", "whole", "eager"),
    ("fused_vs_eager", "fused", "eager"),
    ("fused_vs_fused", "fused2", "fused"),
)


def paired(args, amp: str, tmp: Path) -> dict:
    keys = paired_keys(args, amp, tmp)
    specs = [("eager", "eager", {}), ("eager2", "eager", {}), ("graph", "cuda-graph", {})]
    specs.append(("graph2", "cuda-graph", {}))  # is a replay itself run-to-run deterministic?
    specs.append(("whole", "whole-step", {}))  # fp16: the gradient scaler on the device
    if amp in args.fuse.split(",") and not args.ddp:
        fused = {"fuse": args.fuse_mode} | dict(k.split("=", 1) for k in args.fused_keys)
        specs.append(("fused", "whole-step", fused))
        specs.append(("fused2", "whole-step", fused))  # run to run
    arms = {
        name: Arm({**keys, **extra, "graph": graph, "name": f"{amp}-{name}"}, args.ddp)
        for name, graph, extra in specs
    }
    batches = fetch_batches(arms["eager"], args.steps)
    runs = {name: train(arm, batches, args) for name, arm in arms.items()}
    result: dict = {"amp": amp, "init_scale": args.init_scale if arms["eager"].scaler else None}
    result["used"] = {name: arm.used for name, arm in arms.items()}
    result["called_through"] = {name: arm.called_through for name, arm in arms.items()}
    result["updates"] = {name: run["updates"] for name, run in runs.items()}
    for pair, name, reference in PAIRS:
        if name in arms:
            result[pair] = compare(arms[reference], arms[name], runs[reference], runs[name])
    result["counts"] = {name: run["counts"] for name, run in runs.items()}
    result["memory_mib"] = {
        n: {
            "peak_allocated": round(r["peak_allocated_mib"]),
            "peak_reserved": round(r["peak_reserved_mib"]),
        }
        for n, r in runs.items()
    }
    result["seconds"] = {n: round(r["seconds"], 2) for n, r in runs.items()}
    result |= {f"losses_{n}": r["losses"].tolist() for n, r in runs.items()}
    result["verdict"] = verdict(result, args.min_updated)
    return result


# ------------------------------------------------------------------------------------------
# The verdict
# ------------------------------------------------------------------------------------------
def _power(scale: float) -> str:
    exponent = math.log2(scale) if scale > 0 else 0.5
    return f"2^{int(exponent)}" if exponent == int(exponent) else f"{scale:g}"


def update_verdict(amp: str, name: str, updates: dict, least: float) -> tuple[str, bool]:
    """``"fp16 whole: updated 5/6 update steps ..."`` and whether the arm passes: at least
    ``least`` of the updates not forced to overflow changed the weights, and the forced one
    (if any) did not."""
    changed, forced = updates["changed"], updates["forced_overflow_window"]
    free = [c for i, c in enumerate(changed, 1) if i != forced]
    forced_skipped = forced is None or not changed[forced - 1]
    ok = bool(free) and sum(free) >= least * len(free) and forced_skipped
    line = f"{amp} {name}: updated {sum(changed)}/{len(changed)} update steps"
    if forced is not None:
        state = "skipped" if forced_skipped else "NOT skipped"
        line += f" ({sum(free)}/{len(free)} not forced; the forced overflow at update {forced}: "
        line += f"{state})"
    if updates["scales_after"]:
        line += f", scale after each update {', '.join(map(_power, updates['scales_after']))}"
    if not ok:
        line += f": FAIL (needs {math.ceil(least * len(free))}/{len(free)} updated"
        line += ", and the forced overflow skipped)" if forced is not None else ")"
    return line, ok


def compare_verdict(amp: str, pair: str, c: dict) -> str:
    g, w = c["grads"], c["weights_per_update"]
    counts = (
        f"losses {c['losses_equal']}/{c['losses']}, grads {g['equal']}/{g['of']}, "
        f"weights {w['equal']}/{w['of']}, final tensors {c['tensors_equal']}/{c['tensors']}"
    )
    bit = (
        c["losses_equal"] == c["losses"]
        and g["equal"] == g["of"]
        and w["equal"] == w["of"]
        and c["tensors_equal"] == c["tensors"]
    )
    if bit:
        return f"{amp} {pair}: bit for bit ({counts})"
    return (
        f"{amp} {pair}: differs ({counts}; max |d loss| {c['loss_max_abs_diff']:.3g}, "
        f"max |d grad| {g['max_abs_diff']:.3g} (rel {g['max_rel_diff']:.3g}), "
        f"max |d weight| {w['max_abs_diff']:.3g} (rel {w['max_rel_diff']:.3g}), "
        f"final {c['max_abs_diff']:.3g} in {c['worst_tensor']})"
    )


def verdict(result: dict, least: float) -> dict:
    amp = result["amp"]
    lines, failed = [], []
    for name, updates in result["updates"].items():
        line, ok = update_verdict(amp, name, updates, least)
        lines.append(line)
        if not ok:
            failed.append(f"{amp} {name}")
    used = ", ".join(f"{n}={u}" for n, u in result["used"].items())
    lines.append(f"{amp} backends used: {used}")
    lines += [compare_verdict(amp, pair, result[pair]) for pair, *_ in PAIRS if pair in result]
    return {"lines": lines, "failed": failed}


# ------------------------------------------------------------------------------------------
# The failure path and full runs
# ------------------------------------------------------------------------------------------
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
    try:  # the plugin's own pieces; a layout without them skips this part
        from falconet_graphs_cuda.graphed import GraphedNetwork
        from falconet_graphs_cuda.recording import CudaRecorder
    except ImportError as exc:
        return {"skipped": f"{type(exc).__name__}: {exc}"}

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
        same_step = torch.equal(outs[0], outs[1]) and all(
            torch.equal(a, b)
            for a, b in zip(net.state_dict().values(), twin.state_dict().values(), strict=True)
        )
        equal_steps += same_step
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=".data/coco128/coco128.yaml")
    parser.add_argument("--amp", default="fp32,fp16,bf16")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=24, help="batches per arm (4 per update)")
    parser.add_argument("--device", default="", help="the trainers' device key (e.g. cpu)")
    parser.add_argument(
        "--init-scale",
        type=float,
        default=256.0,
        help="fp16: every arm's gradient scaler starts here (torch's 2**16 overflows)",
    )
    parser.add_argument(
        "--overflow-window",
        type=int,
        default=2,
        help="fp16: the update window (1-based) made to overflow on purpose; 0 for none",
    )
    parser.add_argument(
        "--min-updated",
        type=float,
        default=0.75,
        help="fail when an arm's updates changed its weights in fewer than this share",
    )
    parser.add_argument(
        "--keys", nargs="*", default=[], help="more config keys of every arm, key=value"
    )
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
    parser.add_argument(
        "--ddp",
        action="store_true",
        help="call every arm's network through DDP (one process; or N under torchrun)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.strict:
        torch.use_deterministic_algorithms(True, warn_only=True)
    tmp = Path(tempfile.mkdtemp(prefix="check-graphs-"))
    cuda = (torch.cuda.is_available() and args.device in ("", "cuda")) or "cuda" in args.device
    if args.ddp:
        start_one_process_group(torch.device("cuda" if cuda else "cpu"))
    report: dict = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "ddp": args.ddp,
        "paired": [],
    }

    def save() -> None:
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))

    lines, failed = [], []
    for amp in args.amp.split(","):
        if amp == "fp16" and not cuda:
            print("fp16 left out: it needs a CUDA device", flush=True)
            continue
        result = paired(args, amp, tmp)
        # the arms' trainers are garbage now: collected here, not in a loader worker the next
        # precision forks, where a DDP reducer's destructor meets CUDA and aborts the worker
        gc.collect()
        report["paired"].append(result)
        lines += result["verdict"]["lines"]
        failed += result["verdict"]["failed"]
        print(
            json.dumps({k: v for k, v in result.items() if "losses" not in k and k != "verdict"}),
            flush=True,
        )
        save()
    least = f"{args.min_updated:g}"
    lines.append(
        f"verdict: FAIL: fewer than {least} of the updates changed the weights, or the forced "
        f"overflow was not skipped, in {', '.join(failed)}"
        if failed
        else f"verdict: PASS: in every arm at least {least} of the updates changed the weights "
        "(and a forced overflow left them as they were)"
    )
    report["verdict"] = {"lines": lines, "failed": failed, "pass": not failed}
    save()
    if args.full_runs:
        report["full_runs"] = full_runs(args, tmp)
        print(json.dumps(report["full_runs"]), flush=True)
        save()
    if cuda:  # last: if a failed capture broke the process, the paired results are saved
        report["failed_capture"] = failed_capture()
        print(json.dumps(report["failed_capture"]), flush=True)
        save()
    print("\n".join(lines), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
