"""The verdict: which resource limits the step, the evidence, and the keys that address it.

Decided from the unsynchronised half of the window only, by these rules in order (the
thresholds are :data:`THRESHOLDS`, quoted in docs/profiling.md):

1. ``dataloader``: the step waits for the next batch for at least ``loader_wait_fraction``
   of its time.
2. ``memory-pressure`` (GPU): the caching allocator retried after freeing its cache
   (``alloc_retries`` > 0), or called cudaMalloc at least ``cuda_malloc_per_step`` times per
   step in steady state, or the reserved peak reached ``peak_reserved_fraction`` of the
   device's memory.
3. ``host-launch`` (GPU): the GPU was busy less than ``gpu_busy`` of the step: it waits for
   the host to launch work (many short kernels, host synchronisations).
4. ``compute``: otherwise; the GPU is busy and only a cheaper step helps. On the CPU, where
   there is no GPU trace, a step that does not wait for data is ``compute`` (the host computes
   it), and the verdict says it had no GPU trace.

Repeated trials that disagree are ``mixed`` (:func:`combine`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

VERDICTS = ("dataloader", "host-launch", "compute", "memory-pressure", "mixed")

THRESHOLDS: dict[str, float] = {
    "loader_wait_fraction": 0.20,
    "alloc_retries": 1,
    "cuda_malloc_per_step": 1.0,
    "peak_reserved_fraction": 0.95,
    "gpu_busy": 0.70,
    "short_kernel_us": 20.0,
    "tensor_core_share": 0.50,
}
"""dataloader at or above ``loader_wait_fraction``; memory-pressure at or above
``alloc_retries``, ``cuda_malloc_per_step`` or ``peak_reserved_fraction``; host-launch below
``gpu_busy``; ``short_kernel_us`` and ``tensor_core_share`` only shape the evidence and levers."""

FUSED_STEP = (
    "fuse=inductor-loss with bn_silu=triton is the fastest whole step that kept the mAP on the "
    "fp16 overfit check; not bit for bit: check the mAP of your own run with the overfit check "
    "(docs/performance.md, 'Keys of graph=whole-step')"
)
"""What the fastest step that kept the mAP is (the fused levers' reason quotes it; what it
measured is in docs/performance.md and the lab log it links). ``fuse=inductor-all``, which
compiles the network too, is not suggested: it is slower than these two, and it lowered the
mAP on the bf16 overfit check."""

BF16_CHECKED = (
    "; in bf16 (this run) the two were checked together only, and the overfit check was not "
    "conclusive: check the mAP of a bf16 run"
)


@dataclass(frozen=True)
class Context:
    """What the levers depend on: the run's keys and what is installed."""

    device: str = "cuda"
    graph: str = "eager"
    fuse: str = "none"
    bn_silu: str = "native"
    precision: str = "bf16"
    batch: int = 16
    workers: int = 8
    cache: str = "none"
    gpu_store_fits: bool | None = None
    """Whether the run's training images would fit ``cache=gpu``'s store (half the GPU's memory
    free before training); ``None`` where not known (off CUDA)."""
    cpu_count: int = 8
    graphs: frozenset[str] = field(default_factory=lambda: frozenset({"eager", "compile"}))
    precisions: frozenset[str] = field(default_factory=lambda: frozenset({"fp32", "bf16"}))


def decide(evidence: Mapping[str, Any], context: Context) -> dict[str, Any]:
    """The verdict for one trial: ``{name, reason, gpu_trace, evidence, also, levers}``.

    ``evidence`` holds the figures of docs/profiling.md (``step_ms``, ``loader_wait_fraction``,
    and on a GPU ``gpu_busy``, ``kernels_per_step``, ...); a GPU figure that is ``None`` was
    not measured. ``also`` lists the other rules whose threshold was crossed.
    """
    t = THRESHOLDS
    gpu_trace = evidence.get("gpu_busy") is not None
    fired: list[tuple[str, str]] = []
    wait = evidence.get("loader_wait_fraction") or 0.0
    if wait >= t["loader_wait_fraction"]:
        fired.append(
            (
                "dataloader",
                f"the step waited for the next batch {wait:.0%} of its time "
                f"(>= {t['loader_wait_fraction']:.0%})",
            )
        )
    pressure = _memory_pressure(evidence)
    if pressure:
        fired.append(("memory-pressure", pressure))
    if gpu_trace:
        busy = evidence["gpu_busy"]
        if busy < t["gpu_busy"]:
            detail = _launch_detail(evidence)
            fired.append(
                (
                    "host-launch",
                    f"the GPU was busy {busy:.0%} of the step (< {t['gpu_busy']:.0%}): it "
                    f"waits for the host{detail}",
                )
            )
        else:
            fired.append(
                ("compute", f"the GPU was busy {busy:.0%} of the step (>= {t['gpu_busy']:.0%})")
            )
    else:
        fired.append(
            (
                "compute",
                f"no GPU trace (device {context.device}): the host computes the step; kernel "
                "figures were not measured",
            )
        )
    name, reason = fired[0]
    return {
        "name": name,
        "reason": reason,
        "gpu_trace": gpu_trace,
        "evidence": dict(evidence),
        "also": [f"{n}: {r}" for n, r in fired[1:] if n != "compute"],
        "levers": levers(name, evidence, context),
    }


def _memory_pressure(evidence: Mapping[str, Any]) -> str:
    t = THRESHOLDS
    reasons = []
    retries = evidence.get("alloc_retries")
    if retries is not None and retries >= t["alloc_retries"]:
        reasons.append(f"the allocator freed its cache and retried {retries:g} times")
    mallocs = evidence.get("cuda_malloc_per_step")
    if mallocs is not None and mallocs >= t["cuda_malloc_per_step"]:
        reasons.append(
            f"{mallocs:.1f} cudaMalloc calls per step (>= {t['cuda_malloc_per_step']:g})"
        )
    peak = evidence.get("peak_reserved_fraction")
    if peak is not None and peak >= t["peak_reserved_fraction"]:
        reasons.append(f"reserved memory peaked at {peak:.0%} of the device")
    return "; ".join(reasons)


def _launch_detail(evidence: Mapping[str, Any]) -> str:
    parts = []
    if evidence.get("kernels_per_step") is not None:
        parts.append(f"{evidence['kernels_per_step']:.0f} kernels per step")
    mean = evidence.get("mean_kernel_us")
    if mean is not None:
        short = " (short)" if mean < THRESHOLDS["short_kernel_us"] else ""
        parts.append(f"mean kernel {mean:.1f} µs{short}")
    if evidence.get("host_syncs_per_step"):
        parts.append(f"{evidence['host_syncs_per_step']:.1f} host syncs per step")
    return f" ({', '.join(parts)})" if parts else ""


def _lever(key: str, value: Any, why: str, needs: str | None = None) -> dict[str, Any]:
    lever = {"key": key, "value": value, "set": f"{key}={value}", "why": why}
    if needs:
        lever["needs"] = needs
    return lever


def _fused_step_levers(c: Context) -> list[dict[str, Any]]:
    """``bn_silu=triton`` (BatchNorm and SiLU as one Triton op) and ``fuse=inductor-loss``
    (the loss compiled), the two parts of the fastest step that kept the mAP; neither where a
    compiled network (``fuse=inductor``, ``inductor-all``) already runs Inductor's BatchNorm,
    with which ``bn_silu=triton`` does not combine."""
    if c.fuse in ("inductor", "inductor-all"):
        return []
    caveat = "" if c.precision == "fp16" else BF16_CHECKED
    out = []
    if c.bn_silu != "triton":
        why = (
            "BatchNorm and SiLU as one op on Triton kernels, fewer bytes moved (most with "
            "bf16, where PyTorch runs its own BatchNorm kernels instead of cuDNN's); "
            + FUSED_STEP
            + caveat
        )
        out.append(_lever("bn_silu", "triton", why))
    if c.fuse == "none":
        why = (
            "compile the loss and its assigner with Inductor inside the captured step: fewer, "
            "fused kernels, a compilation per target bucket at the start; " + FUSED_STEP + caveat
        )
        out.append(_lever("fuse", "inductor-loss", why))
    return out


def levers(name: str, evidence: Mapping[str, Any], c: Context) -> list[dict[str, Any]]:
    """The training keys that address verdict ``name``, as ``{key, value, set, why[, needs]}``;
    a key already at the suggested value is left out."""
    out: list[dict[str, Any]] = []
    if name == "dataloader":
        # cache=gpu draws each batch's plan on one host thread and renders it on the GPU: no
        # loader workers there to add
        on_gpu = c.cache in ("gpu", "encoded", "stream")  # augmented on the GPU
        if c.workers < c.cpu_count and not on_gpu:
            more = min(c.cpu_count, max(2 * c.workers, 1))
            out.append(
                _lever(
                    "workers",
                    more,
                    f"{c.workers} loader workers; this machine has {c.cpu_count} CPUs",
                )
            )
        if c.device == "cuda" and not on_gpu and c.gpu_store_fits is not False:
            out.append(
                _lever(
                    "cache",
                    "gpu",
                    "decode once into GPU memory and augment each batch on the GPU: the CPU "
                    "workers leave the step's path (docs/gpu-data.md, its memory cost)",
                )
            )
        elif c.device == "cuda" and not on_gpu:
            out.append(
                _lever(
                    "cache",
                    "encoded",
                    "the images do not fit in half the GPU's free memory decoded: hold the "
                    "files' bytes in host memory and decode each batch on the GPU (nvJPEG), "
                    "augmented there; cache=stream reads them per batch (docs/data.md)",
                )
            )
        elif c.cache == "none":  # off CUDA
            out.append(_lever("cache", "ram", "decode each image once instead of every epoch"))
    elif name == "host-launch":
        needs = None if "cuda-graph" in c.graphs else "pip install falconet-graphs-cuda"
        if c.graph not in ("cuda-graph", "whole-step"):
            out.append(
                _lever(
                    "graph",
                    "cuda-graph",
                    "replay the network's forward and backward from CUDA graphs: one launch "
                    "per graph instead of one per kernel",
                    needs,
                )
            )
        if c.graph != "whole-step":
            out.append(
                _lever(
                    "graph",
                    "whole-step",
                    "replay the loss, optimizer and EMA from graphs as well (a static-shaped "
                    "loss such as yolo with assigner=tal; fp16 with sgd only)",
                    needs,
                )
            )
        if c.graph == "eager":
            out.append(_lever("graph", "compile", "fuse elementwise kernels: fewer launches"))
        peak = evidence.get("peak_reserved_fraction")
        if peak is None or peak < 0.5:
            out.append(
                _lever(
                    "batch",
                    2 * c.batch,
                    "more work per launch; nbs keeps the optimizer's nominal batch",
                )
            )
    elif name == "compute":
        share = evidence.get("tensor_core_share")
        if c.device == "cpu":
            pass  # the host computes the step: no key of falconet makes it cheaper here
        elif c.precision == "fp32":
            out.append(_lever("amp_dtype", "bf16", "Tensor Cores and half the memory traffic"))
        else:
            low = share is not None and share < THRESHOLDS["tensor_core_share"]
            if low and c.graph == "eager":
                why = f"only {share:.0%} of kernel time is on Tensor Cores; fuse the rest"
                out.append(_lever("graph", "compile", why))
            if c.precision == "bf16" and "fp16" in c.precisions:
                why = (
                    "BatchNorm runs on cuDNN in fp16 and on slower native kernels in bf16 "
                    "(tools/bench_batchnorm.py times the two; the overfit check trained fp16 to "
                    "the same mAP: docs/performance.md, 'amp_dtype'); fp16 adds a gradient "
                    "scaler, which graph=whole-step carries with SGD only"
                )
                out.append(_lever("amp_dtype", "fp16", why))
            if c.graph == "whole-step" and c.device == "cuda":
                out += _fused_step_levers(c)
            if "fp8" in c.precisions and c.precision != "fp8":
                out.append(_lever("amp_dtype", "fp8", "FP8 Tensor Cores (Hopper and later)"))
    elif name == "memory-pressure":
        if c.batch > 1:
            out.append(
                _lever(
                    "batch",
                    max(c.batch // 2, 1),
                    "halve activation memory; nbs keeps the optimizer's nominal batch",
                )
            )
        if c.precision == "fp32":
            out.append(_lever("amp_dtype", "bf16", "half-size activations"))
    return out


def combine(names: Sequence[str]) -> str:
    """One verdict for repeated trials: theirs when they agree, else ``mixed``."""
    unique = set(names)
    return unique.pop() if len(unique) == 1 else "mixed"
