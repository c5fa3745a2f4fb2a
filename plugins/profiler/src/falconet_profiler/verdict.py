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

from falconet.install_hints import lever_hints
from falconet.levers import VERDICTS as LEVER_VERDICTS
from falconet.levers import Lever, LeverContext, Suggestion

VERDICTS = (*LEVER_VERDICTS, "mixed")

THRESHOLDS: dict[str, float] = {
    "loader_wait_fraction": 0.20,
    "alloc_retries": 1,
    "cuda_malloc_per_step": 1.0,
    "peak_reserved_fraction": 0.95,
    "gpu_busy": 0.70,
    "short_kernel_us": 20.0,
}
"""dataloader at or above ``loader_wait_fraction``; memory-pressure at or above
``alloc_retries``, ``cuda_malloc_per_step`` or ``peak_reserved_fraction``; host-launch below
``gpu_busy``; ``short_kernel_us`` only shapes the evidence. What a lever decides by is the
lever's own (``register_levers``: :mod:`falconet.levers`)."""


@dataclass(frozen=True)
class Context:
    """What the levers depend on: the run's facts and keys, and what is installed.

    ``levers`` are the installed plugins' levers (``register_levers``; the core's own keys are
    the built-in plugin's), ``distributions`` the distributions that loaded: a verdict's lever
    of a plugin not installed comes from the core's install hints.
    """

    device: str = "cuda"
    graph: str = "eager"
    precision: str = "bf16"
    batch: int = 16
    workers: int = 8
    cache: str = "none"
    gpu_store_fits: bool | None = None
    """Whether the run's training images would fit ``cache=gpu``'s store (half the GPU's memory
    free before training); ``None`` where not known (off CUDA)."""
    cpu_count: int = 8
    options: Mapping[str, Any] = field(default_factory=dict)
    """Every key of the run, plugins' keys included (what a lever reads its own keys from)."""
    graphs: frozenset[str] = field(default_factory=lambda: frozenset({"eager", "compile"}))
    precisions: frozenset[str] = field(default_factory=lambda: frozenset({"fp32", "bf16"}))
    levers: tuple[Lever, ...] = ()
    distributions: frozenset[str] = frozenset()

    def current(self, key: str) -> Any:
        """The run's value of ``key``: the resolved backend for ``graph`` and ``amp_dtype``."""
        resolved = {"graph": self.graph, "amp_dtype": self.precision, "batch": self.batch}
        resolved |= {"workers": self.workers, "cache": self.cache}
        return resolved[key] if key in resolved else self.options.get(key)


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


def levers(name: str, evidence: Mapping[str, Any], c: Context) -> list[dict[str, Any]]:
    """The training keys that address verdict ``name``, as ``{key, value, set, why[, needs]}``.

    Each installed lever whose ``verdicts`` hold ``name`` is asked, highest ``priority`` first;
    a suggestion of a value the run already has is left out, whoever made it. Then, for the
    levers the core's install hints list under ``name`` whose distribution did not load, the
    ``key=value`` with the install command.
    """
    context = LeverContext(
        verdict=name,
        evidence=evidence,
        device=c.device,
        graph=c.graph,
        precision=c.precision,
        batch=c.batch,
        workers=c.workers,
        cache=c.cache,
        gpu_store_fits=c.gpu_store_fits,
        cpu_count=c.cpu_count,
        options=c.options,
        graph_backends=c.graphs,
        precision_backends=c.precisions,
    )
    out: list[dict[str, Any]] = []
    for lever in sorted(c.levers, key=lambda lever: -lever.priority):
        if name not in lever.verdicts:
            continue
        suggestion = lever.suggest(context)
        if suggestion is None or c.current(suggestion.key) == suggestion.value:
            continue
        if all(o["set"] != f"{suggestion.key}={suggestion.value}" for o in out):
            out.append(suggestion.as_dict())
    for setting, distribution in lever_hints(name).items():
        key, value = setting.split("=", 1)
        if distribution in c.distributions or str(c.current(key)) == value:
            continue
        why = f"a lever of {distribution}, which is not installed here"
        out.append(Suggestion(key, value, why, needs=f"pip install {distribution}").as_dict())
    return out


def combine(names: Sequence[str]) -> str:
    """One verdict for repeated trials: theirs when they agree, else ``mixed``."""
    unique = set(names)
    return unique.pop() if len(unique) == 1 else "mixed"
