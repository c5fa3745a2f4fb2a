"""Where does ``graph=cuda-graph`` first part from eager? A GPU diagnosis for check_graphs.py.

    python tools/trace_graph_divergence.py --data .data/coco128/coco128.yaml --amp fp32 \\
        --steps 24 --out divergence.json

``check_graphs.py`` says whether two runs end equal; this script says where they stop being
equal. Two trainers (eager and cuda-graph, deterministic algorithms, SGD) start from the same
state and train on the same batches; the optimizer step is driven from here so that the
accumulated gradients can be compared *before* it and the weights and momentum *after* it.
After every batch: the loss and each parameter's accumulated gradient; after every update:
each weight and momentum buffer. The first mismatch is reported with the tensors that differ
(largest difference, and the gradient's and parameter's strides in both runs, since a
gradient whose layout differs can take another kernel path in the optimizer).

Then one batch in isolation: the network called eagerly vs one replay of a fresh recording
(:class:`~falconet_graphs_cuda.recording.CudaRecorder`, its gradient buffers laid out as the
eager output gradients) from the same weights, with the same output gradients: are the
outputs, then the parameter gradients, bit for bit equal?

What it found on the H200 (torch 2.11, fp32): only the head's last convolution biases
differed, because the recording's output-gradient buffers were channels-last where the
loss's gradients are strided slices, and a bias gradient sums over them in another order;
hence :func:`~falconet_graphs_cuda.graphed.grad_buffer`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from check_graphs import build, fetch_batches, paired_keys


def differing(a: dict, b: dict, limit: int = 8) -> list[dict]:
    """The tensors of ``a`` and ``b`` (same names) that are not bit-equal, largest first."""
    rows = []
    for name, x in a.items():
        y = b[name]
        if x is None or y is None:
            if (x is None) != (y is None):
                rows.append({"name": name, "diff": "one is None"})
            continue
        same = (x == y) | (x.isnan() & y.isnan())  # an overflowed fp16 step: NaN in both
        if not bool(same.all()):
            diff = (x.double() - y.double()).abs().nan_to_num(float("inf"))
            rows.append({"name": name, "max_abs": diff.max().item(), "n_diff": int((~same).sum())})
    rows.sort(key=lambda r: -r.get("max_abs", float("inf")))
    return rows[:limit] + ([{"more": len(rows) - limit}] if len(rows) > limit else [])


def grads(trainer) -> dict:
    return {
        n: (None if p.grad is None else p.grad.detach().clone())
        for n, p in trainer.model.named_parameters()
    }


def layouts(trainer, names: list[str]) -> dict:
    params = dict(trainer.model.named_parameters())
    return {
        n: {"param": list(params[n].stride()), "grad": list(params[n].grad.stride())}
        for n in names
        if n in params and params[n].grad is not None
    }


def after_update(trainer) -> dict:
    out = {f"w.{n}": p.detach().clone() for n, p in trainer.model.named_parameters()}
    for i, state in enumerate(trainer.optimizer.state.values()):
        out |= {f"m.{i}.{k}": v.clone() for k, v in state.items() if torch.is_tensor(v)}
    return out


def trace(args, amp: str, tmp: Path) -> dict:
    from falconet.data.targets import TARGET_KEYS

    keys = paired_keys(args, amp, tmp)
    arms = {g: build({**keys, "graph": g, "name": f"{amp}-{g}"}) for g in ("eager", "cuda-graph")}
    batches = fetch_batches(arms["eager"], args.steps)
    events: list[dict] = []
    for i, batch in enumerate(batches):
        seen = {}
        for name, trainer in arms.items():
            images = batch["images"].to(trainer.device).float().div_(255)
            targets = {k: batch[k].to(trainer.device) for k in TARGET_KEYS}
            loss, _ = trainer.train_batch(images, targets, optimizer_step=False)
            seen[name] = {"loss": loss.detach().float().item(), "grads": grads(trainer)}
        e, g = seen["eager"], seen["cuda-graph"]
        diff = differing(e["grads"], g["grads"])
        if e["loss"] != g["loss"] or diff:
            events.append(
                {
                    "batch": i,
                    "stage": "after backward",
                    "loss": [e["loss"], g["loss"]],
                    "grads": diff,
                    "layouts": {
                        n: layouts(t, [r["name"] for r in diff if "name" in r])
                        for n, t in arms.items()
                    },
                    "graph_counts": dict(arms["cuda-graph"].network.counts),
                }
            )
        if (i + 1) % arms["eager"].accumulate == 0:
            for trainer in arms.values():
                trainer._optimizer_step()
            diff = differing(after_update(arms["eager"]), after_update(arms["cuda-graph"]))
            if diff:
                events.append({"batch": i, "stage": "after optimizer step", "tensors": diff})
        if len(events) >= args.events:
            break
    return {"amp": amp, "first_mismatches": events, "accumulate": arms["eager"].accumulate}


def one_batch(args, amp: str, tmp: Path) -> dict:
    """Eager network vs one replay of a recording, same weights and output gradients."""
    from torch.utils._pytree import tree_flatten

    from falconet_graphs_cuda.recording import CudaRecorder

    trainer = build({**paired_keys(args, amp, tmp), "graph": "eager", "name": f"{amp}-one"})
    batch = fetch_batches(trainer, 1)[0]
    images = batch["images"].to(trainer.device).float().div_(255)
    network = trainer.network
    params = [p for p in network.parameters() if p.requires_grad]
    names = [n for n, p in network.named_parameters() if p.requires_grad]
    buffers = [b.detach().clone() for b in network.buffers()]
    with trainer.precision.autocast(trainer.device):
        flat = tree_flatten(network(images))[0]
    wanted = [o for o in flat if o.requires_grad]
    gen = torch.Generator(trainer.device).manual_seed(0)
    seeds = [torch.randn(o.shape, device=o.device, generator=gen).to(o.dtype) for o in wanted]
    eager_grads = torch.autograd.grad(wanted, params, seeds, allow_unused=True)
    with torch.no_grad():  # the replay's BatchNorm starts from the same running statistics
        for b, saved in zip(network.buffers(), buffers, strict=True):
            b.copy_(saved)
    with trainer.precision.autocast(trainer.device):
        recording = CudaRecorder()(network, images, params, [s.stride() for s in seeds])
    recording.static_input.copy_(images)
    recording.forward()
    for static, seed in zip(recording.grad_outputs, seeds, strict=True):
        static.copy_(seed)
    recording.backward()
    torch.cuda.synchronize()
    outs = {f"out{i}": o.detach() for i, o in enumerate(flat)}
    replay_outs = {f"out{i}": o for i, o in enumerate(recording.outputs)}
    return {
        "amp": amp,
        "outputs": differing(outs, replay_outs),
        "outputs_total": len(outs),
        "grads": differing(
            dict(zip(names, eager_grads, strict=True)),
            dict(zip(names, recording.grads, strict=True)),
            limit=20,
        ),
        "grads_total": len(names),
        "grad_layouts": {
            n: {"eager": list(a.stride()), "replay": list(b.stride()), "param": list(p.stride())}
            for n, a, b, p in zip(names, eager_grads, recording.grads, params, strict=True)
            if a is not None and b is not None and a.stride() != b.stride()
        },
        "buffers_equal_after": sum(
            torch.equal(a, b) for a, b in zip(network.buffers(), buffers, strict=True)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=".data/coco128/coco128.yaml")
    parser.add_argument("--amp", default="fp32,fp16")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--events", type=int, default=3, help="stop after this many mismatches")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not torch.cuda.is_available():
        raise SystemExit("trace_graph_divergence.py compares CUDA graph replays: it needs a GPU")
    torch.use_deterministic_algorithms(True, warn_only=True)
    tmp = Path(tempfile.mkdtemp(prefix="graph-divergence-"))
    report: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    for amp in args.amp.split(","):
        for name, fn in (("one_batch", one_batch), ("trace", trace)):
            try:
                result = fn(args, amp, tmp)
            except Exception as exc:  # one precision's failure must not lose the others
                result = {"amp": amp, "error": f"{type(exc).__name__}: {exc}"}
            report.setdefault(name, []).append(result)
            print(json.dumps(result)[:4000], flush=True)
            if args.out:
                args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
