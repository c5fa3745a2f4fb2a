"""``profile.json`` and its companions: building the document, writing and reading the files,
and the report printed at the end of the window.

``profile.json`` is self-contained (schema :data:`falconet_profiler.SCHEMA`, in the
``schema`` field): the run's keys, the window, both halves' timings, the kernel figures, the
memory figures, the evidence, the verdict with its levers, the trials (one, or ``--repeat``'s
N with their mean and spread), every measured batch's phases and the kernel lanes, so
``timeline.html`` and every ``falconet profile`` command can be rebuilt from it alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from falconet_profiler import SCHEMA
from falconet_profiler.kernel_names import label

KIND = "falconet-profile"
PROFILE = "profile.json"
TRACE = "profile_trace.json"
SUMMARY = "profile_summary.json"
TIMELINE = "timeline.html"

HEADLINE = (
    "step_ms",
    "img_per_s",
    "update_ms",
    "loader_wait_fraction",
    "host_ms_per_step",
    "gpu_busy",
    "kernels_per_step",
    "mean_kernel_us",
    "host_syncs_per_step",
    "cuda_malloc_per_step",
    "alloc_retries",
    "peak_reserved_gib",
    "peak_reserved_fraction",
    "tensor_core_share",
)
"""The per-trial figures that trials aggregate and ``compare`` compares."""

REQUIRED = ("schema", "kind", "run", "window", "unsynced", "synced", "evidence", "verdict")


class ProfileFileError(ValueError):
    """A file that is not a falconet profile this version can read; the message says why."""


def evidence_of(
    unsynced: Mapping[str, Any], gpu: Mapping[str, Any] | None, memory: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The verdict's evidence: the unsynchronised half's figures (GPU ones ``None`` on the CPU)."""
    gpu = gpu or {}
    memory = memory or {}
    return {
        "step_ms": unsynced["step_ms"]["mean"],
        "img_per_s": unsynced["img_per_s"],
        "update_ms": unsynced["update_ms"],
        "loader_wait_fraction": unsynced["loader_wait_fraction"],
        "host_ms_per_step": unsynced["host_ms_per_batch"],
        "gpu_busy": gpu.get("gpu_busy"),
        "kernels_per_step": gpu.get("kernels_per_step"),
        "mean_kernel_us": gpu.get("mean_kernel_us"),
        "host_syncs_per_step": gpu.get("host_syncs_per_step"),
        "cuda_malloc_per_step": memory.get("cuda_malloc_per_step"),
        "alloc_retries": memory.get("alloc_retries"),
        "peak_reserved_gib": memory.get("peak_reserved_gib"),
        "peak_reserved_fraction": memory.get("peak_reserved_fraction"),
        "tensor_core_share": gpu.get("tensor_core_share"),
        "top_kernels": [k["name"] for k in gpu.get("top_kernels", [])[:3]],
        # the three kinds that took the most kernel time: what a step's GPU time is spent on
        "kernel_kinds": [[k["what"], k["ms_per_step"]] for k in gpu.get("kernel_kinds", [])[:3]],
    }


def headline(doc: Mapping[str, Any]) -> dict[str, Any]:
    """One trial's row in ``trials``: its run folder, verdict and :data:`HEADLINE` figures."""
    evidence = doc["evidence"]
    row = {"run_dir": doc["run"]["run_dir"], "verdict": doc["verdict"]["name"]}
    row.update({key: evidence.get(key) for key in HEADLINE})
    return row


def summary_of(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``profile_summary.json``: the verdict, its levers and the headline figures."""
    verdict = doc["verdict"]
    return {
        "schema": SCHEMA,
        "kind": f"{KIND}-summary",
        "run": doc["run"],
        "verdict": verdict["name"],
        "reason": verdict["reason"],
        "gpu_trace": verdict["gpu_trace"],
        "levers": verdict["levers"],
        "also": verdict.get("also", []),
        "trials": len(doc["trials"]),
        "aggregate": doc["aggregate"],
        "profile": PROFILE,
    }


def write_json(path: Path, document: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(json_safe(document), indent=1))
    tmp.replace(path)


def json_safe(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_artifacts(folder: Path, doc: dict[str, Any]) -> dict[str, Path]:
    """``profile.json``, ``profile_summary.json`` and ``timeline.html`` in ``folder`` (the
    trace is written by whoever holds it); returns their paths."""
    from falconet_profiler.timeline import render

    paths = {
        "profile": folder / PROFILE,
        "summary": folder / SUMMARY,
        "timeline": folder / TIMELINE,
    }
    write_json(paths["profile"], doc)
    write_json(paths["summary"], summary_of(doc))
    paths["timeline"].write_text(render(doc))
    return paths


def load(path: str | Path) -> dict[str, Any]:
    """A ``profile.json`` (or the folder holding one), checked against the schema."""
    path = Path(path)
    if path.is_dir():
        path = path / PROFILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileFileError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProfileFileError(f"{path}: not JSON ({exc})") from None
    problems = check(doc)
    if problems:
        raise ProfileFileError(f"{path}: not a falconet profile: {'; '.join(problems)}")
    return doc


def check(doc: Any) -> list[str]:
    """What makes ``doc`` not a schema-``SCHEMA`` profile (empty when it is one)."""
    if not isinstance(doc, dict):
        return ["the top level is not an object"]
    missing = [key for key in REQUIRED if key not in doc]
    if missing:
        return [f"missing {', '.join(missing)}"]
    problems = []
    if doc["kind"] != KIND:
        problems.append(f"kind is {doc['kind']!r}, not {KIND!r}")
    if doc["schema"] != SCHEMA:
        problems.append(f"schema {doc['schema']!r}; this falconet-profiler reads {SCHEMA}")
    if not isinstance(doc["verdict"], dict) or "name" not in doc["verdict"]:
        problems.append("verdict has no name")
    return problems


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def format_report(doc: Mapping[str, Any], folder: Path | None = None) -> str:
    """The report printed when the window ends (and by ``falconet profile summary``)."""
    run, window, verdict, e = doc["run"], doc["window"], doc["verdict"], doc["evidence"]
    fast = doc["unsynced"]
    lines = [f"profile: {verdict['name']}: {verdict['reason']}"]
    lines.append(
        f"  window: {window['warmup']} discarded, {window['unsynced']} unsynchronised + "
        f"{window['synced']} synchronised batches; batch {run['batch']}, accumulate "
        f"{run['accumulate']}, {_device(run)}, "
        f"{run['precision']}, graph={run['graph']}"
    )
    if run.get("world_size", 1) > 1:
        lines.append(
            f"  note: rank {run.get('rank', 0)} of {run['world_size']} profiled its own steps; "
            "the other ranks were not timed"
        )
    if window.get("graph_captures"):
        lines.append(
            f"  note: {window['graph_captures']} graph capture(s) in the synchronised half; "
            "its phase and kernel times include them (raise profile_warmup)"
        )
    if window.get("eager_batches"):
        lines.append(
            f"  note: {window['eager_batches']} of the window's batches ran eagerly under "
            f"graph={run['graph']} (it had not recorded their shape or target bucket); "
            "raise profile_warmup to time its replays"
        )
    spread = fast["step_ms"]["std"]
    per_update = f"; {_num(e['update_ms'])} ms per optimizer step" if run["accumulate"] > 1 else ""
    lines.append(
        f"  step {_num(e['step_ms'], 2)} ms (sd {_num(spread, 2)}), {_num(e['img_per_s'])} img/s"
        f"{per_update}; loader wait {_pct(e['loader_wait_fraction'])}; host "
        f"{_num(e['host_ms_per_step'], 2)} ms per step in phases"
    )
    if not verdict["gpu_trace"] and "no GPU trace" not in verdict["reason"]:
        # whatever the verdict, say which figures are missing (a CPU run, or no trace taken)
        lines.append(f"  no GPU trace (device {run['device']}): kernel figures were not measured")
    if verdict["gpu_trace"]:
        lines.append(
            f"  GPU busy {_pct(e['gpu_busy'])}, {_num(e['kernels_per_step'], 0)} kernels per "
            f"step, mean kernel {_num(e['mean_kernel_us'])} µs, "
            f"{_num(e['host_syncs_per_step'])} host syncs per step, "
            f"{_num(e['cuda_malloc_per_step'])} cudaMalloc per step, Tensor Cores "
            f"{_pct(e['tensor_core_share'])} of kernel time"
        )
    if doc.get("memory"):
        memory = doc["memory"]
        lines.append(
            f"  memory: peak {_num(memory['peak_allocated_gib'], 2)} GiB allocated, "
            f"{_num(memory['peak_reserved_gib'], 2)} GiB reserved "
            f"({_pct(memory['peak_reserved_fraction'])} of {_num(memory['device_total_gib'])} "
            f"GiB), {memory['alloc_retries']} allocator retries"
        )
    phases = doc["synced"]["phases"]
    if phases:
        shown = "  ".join(f"{k} {v['ms_per_batch']:.2f}" for k, v in phases.items())
        lines.append(f"  phases (synchronised, ms per batch): {shown}")
    if e.get("kernel_kinds"):
        kinds = ", ".join(f"{what} {ms:.2f}" for what, ms in e["kernel_kinds"])
        lines.append(f"  kernel time by kind (ms a step): {kinds}")
    elif e.get("top_kernels"):  # a profile written before the per-kind sums
        lines.append(f"  top kernels: {'; '.join(label(name) for name in e['top_kernels'])}")
    for other in verdict.get("also", []):
        lines.append(f"  also: {other}")
    if verdict["levers"]:
        lines.append("  try: " + ", ".join(_lever_text(lever) for lever in verdict["levers"]))
    if len(doc["trials"]) > 1:
        names = ", ".join(t["verdict"] for t in doc["trials"])
        lines.append(f"  trials: {len(doc['trials'])} ({names})")
    if folder is not None:
        lines.append(f"  files: {folder}/{{{PROFILE},{TRACE},{SUMMARY},{TIMELINE}}}")
    return "\n".join(lines)


def _device(run: Mapping[str, Any]) -> str:
    name = run.get("device_name") or ""
    return f"{run['device']} ({name})" if name and name != run["device"] else run["device"]


def _lever_text(lever: Mapping[str, Any]) -> str:
    needs = f"; needs: {lever['needs']}" if lever.get("needs") else ""
    return f"{lever['set']} ({lever['why']}{needs})"
