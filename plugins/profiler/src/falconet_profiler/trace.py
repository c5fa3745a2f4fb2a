"""Kernel figures from a Chrome trace as torch.profiler exports it (Kineto's JSON).

The profiler callback wraps each measured batch in a ``falconet/batch <index> <part>`` range
and each phase in ``falconet/<phase>`` (``user_annotation`` events on the host). A GPU event
(``kernel``, ``gpu_memcpy``, ``gpu_memset``) belongs to the batch whose range holds the host
call that launched it (matched through ``args.correlation``; the event's own start when the
launch is missing). Everything here is a pure function of the trace, so it is tested on
synthetic traces.

Heuristics, stated once: a host synchronisation is a call named in :data:`SYNC_CALLS`; a
device allocation one in :data:`MALLOC_CALLS`; a kernel runs on Tensor Cores when its name
holds one of :data:`TENSOR_CORE_MARKS` (cuBLAS/cuDNN/CUTLASS name their MMA kernels so).
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from falconet_profiler import kernel_names

GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver"})
SYNC_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaStreamQuery",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
    }
)
CLOCK_SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cuCtxSynchronize"})
"""What ``torch.cuda.synchronize`` calls: the phase clock's own syncs in the traced half."""
MALLOC_CALLS = frozenset(
    {"cudaMalloc", "cudaMallocAsync", "cuMemAlloc", "cuMemAlloc_v2", "cuMemCreate"}
)
LAUNCH_CALLS = frozenset(
    {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"}
)
TENSOR_CORE_MARKS = (
    "hmma",
    "xmma",
    "wgmma",
    "tensorop",
    "nvjet",
    "s16816",
    "h16816",
    "s1688",
    "h1688",
    "s884",
    "h884",
    "i8816",
    "tf32",
    "_tc_",
    "triton_tem_fused_mm",
    "triton_tem_fused_addmm",
    "triton_tem_fused_convolution",
)
BATCH_LABEL = re.compile(r"^falconet/batch (\d+) (unsynced|synced)$")
PHASE_PREFIX = "falconet/"
LANE_BATCHES = 2
"""How many traced batches the kernel lanes of ``timeline.html`` show."""
LANE_CAP = 20000
LANE_KINDS = {"kernel": "kernels", "gpu_memcpy": "copies", "gpu_memset": "memsets"}

Launched = tuple[dict[str, Any], float]
"""A GPU event and the host time (µs) of the call that launched it."""


def load_trace(path: str | Path) -> dict[str, Any]:
    with open(path) as handle:
        return json.load(handle)


def is_tensor_core(name: str) -> bool:
    lowered = name.lower()
    return any(mark in lowered for mark in TENSOR_CORE_MARKS)


def union_ms(intervals: Iterable[tuple[float, float]]) -> float:
    """Milliseconds covered by the union of ``(start, end)`` microsecond intervals."""
    covered, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        start = max(start, reach)
        if end > start:
            covered += end - start
            reach = end
    return covered / 1000


def analyse(trace: dict[str, Any]) -> dict[str, Any] | None:
    """Kernel figures per batch of the traced batches, or ``None`` when the trace holds no
    GPU event.

    torch.profiler runs over the window's synchronised half only (its per-operation cost
    would otherwise slow the unsynchronised half, whose step time must be the real one), so
    every figure is per traced batch: kernels, kernel time, ``gpu_ms_per_step`` (the time the
    GPU was busy: the union of the batch's kernels, copies and memsets), launches, host syncs,
    device allocations, Tensor-Core share, top kernels, kernel time per phase. Synchronising
    changes when kernels start, not how many run nor how long each takes. The callback turns
    ``gpu_ms_per_step`` into the GPU-busy fraction with the unsynchronised step time. Host
    syncs leave out ``cudaDeviceSynchronize``: that is the phase clock's own call.
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    batches: list[tuple[float, float, int, str]] = []
    phase_spans: list[tuple[float, float, str]] = []
    gpu: list[dict[str, Any]] = []
    runtime: list[dict[str, Any]] = []
    for event in events:
        category, name = str(event.get("cat", "")).lower(), event.get("name", "")
        if category == "user_annotation" and name.startswith(PHASE_PREFIX):
            found = BATCH_LABEL.match(name)
            start, end = float(event["ts"]), float(event["ts"]) + float(event.get("dur", 0))
            if found:
                batches.append((start, end, int(found.group(1)), found.group(2)))
            else:
                phase_spans.append((start, end, name.removeprefix(PHASE_PREFIX)))
        elif category in GPU_CATEGORIES:
            gpu.append({**event, "cat": category})
        elif category in RUNTIME_CATEGORIES:
            runtime.append(event)
    if not gpu or not batches:
        return None
    batches.sort()
    starts = [b[0] for b in batches]
    launched_at = {
        e["args"]["correlation"]: float(e["ts"])
        for e in runtime
        if "correlation" in e.get("args", {})
    }

    def batch_of(ts: float) -> int | None:
        at = bisect.bisect_right(starts, ts) - 1
        return at if at >= 0 and ts <= batches[at][1] else None

    owned: list[list[Launched]] = [[] for _ in batches]
    for event in gpu:
        correlation = event.get("args", {}).get("correlation")
        launch = launched_at.get(correlation, float(event["ts"]))
        at = batch_of(launch)
        if at is not None:
            owned[at].append((event, launch))
    calls: dict[str, int] = {}
    for event in runtime:
        if batch_of(float(event["ts"])) is not None:
            calls[event["name"]] = calls.get(event["name"], 0) + 1
    steps = len(batches)
    every = [e for batch in owned for e, _ in batch]
    kernels = [e for e in every if e["cat"] == "kernel"]
    kernel_us = [float(e.get("dur", 0)) for e in kernels]
    busy_ms = sum(
        union_ms(((float(e["ts"]), float(e["ts"]) + e.get("dur", 0)) for e, _ in batch))
        for batch in owned
    )
    syncs = {k: v for k, v in calls.items() if k in SYNC_CALLS and k not in CLOCK_SYNC_CALLS}
    return {
        "traced_batches": steps,
        "kernels_per_step": len(kernels) / steps,
        "mean_kernel_us": sum(kernel_us) / len(kernel_us) if kernel_us else 0.0,
        "kernel_ms_per_step": sum(kernel_us) / 1000 / steps,
        "gpu_ms_per_step": busy_ms / steps,
        "memcpy_per_step": sum(e["cat"] == "gpu_memcpy" for e in every) / steps,
        "launches_per_step": sum(v for k, v in calls.items() if k in LAUNCH_CALLS) / steps,
        "host_syncs_per_step": sum(syncs.values()) / steps,
        "sync_calls": dict(sorted(syncs.items())),
        "cuda_malloc_per_step": sum(v for k, v in calls.items() if k in MALLOC_CALLS) / steps,
        "tensor_core_share": _tensor_core_share(kernels),
        "top_kernels": top_kernels(kernels, steps),
        "kernel_kinds": kernel_kinds(kernels, steps),
        "phase_gpu_ms": _phase_gpu_ms([x for batch in owned for x in batch], phase_spans, steps),
        "lanes": _lanes(
            [x for batch in owned[:LANE_BATCHES] for x in batch], batches[:LANE_BATCHES]
        ),
    }


def _tensor_core_share(kernels: list[dict[str, Any]]) -> float:
    total = sum(float(e.get("dur", 0)) for e in kernels)
    tensor = sum(float(e.get("dur", 0)) for e in kernels if is_tensor_core(e["name"]))
    return tensor / total if total else 0.0


def top_kernels(kernels: list[dict[str, Any]], steps: int, top: int = 50) -> list[dict[str, Any]]:
    """Kernels by total time: name, what it does (:func:`kernel_names.label`), calls per step,
    ms per step, mean µs, share, Tensor Core."""
    table: dict[str, list[float]] = {}
    for event in kernels:
        table.setdefault(event["name"], []).append(float(event.get("dur", 0)))
    total = sum(sum(v) for v in table.values()) or 1.0
    rows = sorted(table.items(), key=lambda item: -sum(item[1]))[:top]
    steps = max(steps, 1)
    return [
        {
            "name": name,
            "what": kernel_names.label(name),
            "calls_per_step": len(durations) / steps,
            "ms_per_step": sum(durations) / 1000 / steps,
            "mean_us": sum(durations) / len(durations),
            "share": sum(durations) / total,
            "tensor_core": is_tensor_core(name),
        }
        for name, durations in rows
    ]


def kernel_kinds(kernels: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """Every kernel summed by what it does (:func:`kernel_names.label`), largest first: calls
    per step, ms per step, mean µs, share, Tensor Core (if any of them is). Unlike
    :func:`top_kernels`, nothing is left out: in a fused step most of Inductor's time is in
    hundreds of kernels of a few µs, none of them among the top 50."""
    table: dict[str, dict[str, Any]] = {}
    for event in kernels:
        name = event["name"]
        row = table.setdefault(
            kernel_names.label(name), {"calls": 0, "us": 0.0, "tensor_core": False}
        )
        row["calls"] += 1
        row["us"] += float(event.get("dur", 0))
        row["tensor_core"] |= is_tensor_core(name)
    total = sum(row["us"] for row in table.values()) or 1.0
    steps = max(steps, 1)
    return [
        {
            "what": what,
            "calls_per_step": row["calls"] / steps,
            "ms_per_step": row["us"] / 1000 / steps,
            "mean_us": row["us"] / row["calls"],
            "share": row["us"] / total,
            "tensor_core": row["tensor_core"],
        }
        for what, row in sorted(table.items(), key=lambda item: -item[1]["us"])
    ]


def _phase_gpu_ms(
    events: list[Launched], spans: list[tuple[float, float, str]], batches: int
) -> dict[str, float]:
    """Kernel milliseconds per batch by the phase that launched them (synchronised half)."""
    spans = sorted(spans)
    starts = [s[0] for s in spans]
    out: dict[str, float] = {}
    for event, launch in events:
        at = bisect.bisect_right(starts, launch) - 1
        if at >= 0 and launch <= spans[at][1]:
            name = spans[at][2]
            out[name] = out.get(name, 0.0) + float(event.get("dur", 0)) / 1000
    return {k: v / max(batches, 1) for k, v in out.items()}


def _lanes(events: list[Launched], batches: list[tuple[float, float, int, str]]) -> dict[str, Any]:
    """GPU events of the first unsynchronised batches for the timeline: one lane per stream,
    ``[lane, start µs from the first batch's start, duration µs, name index]``."""
    if not batches:
        return {"origin_us": 0.0, "batches": [], "names": [], "lanes": [], "events": []}
    lo, hi = batches[0][0], batches[-1][1]
    chosen = sorted((e for e, at in events if lo <= at <= hi), key=lambda e: float(e["ts"]))
    chosen = chosen[:LANE_CAP]
    names: dict[str, int] = {}
    lanes: dict[str, int] = {}
    rows = []
    for event in chosen:
        lane = f"{LANE_KINDS[event['cat']]}, stream {event.get('tid', '?')}"
        rows.append(
            [
                lanes.setdefault(lane, len(lanes)),
                round(float(event["ts"]) - lo, 3),
                round(float(event.get("dur", 0)), 3),
                names.setdefault(event["name"], len(names)),
            ]
        )
    return {
        "origin_us": lo,
        "batches": [[round(b[0] - lo, 3), round(b[1] - lo, 3), b[2]] for b in batches],
        "names": list(names),
        "lanes": list(lanes),
        "events": rows,
    }


def kinds_from_lanes(lanes: dict[str, Any] | None) -> tuple[list[dict[str, Any]], int] | None:
    """:func:`kernel_kinds` of the kernels a profile's timeline holds, and how many batches
    they cover: per-kind sums over every kernel for a profile written before
    ``kernel_kinds``. ``None`` when there is no timeline or it was cut at ``LANE_CAP``."""
    if not lanes or not lanes["batches"] or len(lanes["events"]) >= LANE_CAP:
        return None
    kernel_lanes = {i for i, lane in enumerate(lanes["lanes"]) if lane.startswith("kernels")}
    kernels = [
        {"name": lanes["names"][name], "dur": dur}
        for lane, _start, dur, name in lanes["events"]
        if lane in kernel_lanes
    ]
    return kernel_kinds(kernels, len(lanes["batches"])), len(lanes["batches"])


def host_trace(batches: list[dict[str, Any]], pid: str = "falconet host") -> dict[str, Any]:
    """A Chrome trace of the measured batches' phases (what ``profile_trace.json`` holds when
    there is no GPU trace): one ``X`` event per batch and per phase, on one host lane."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": pid}}
    ]
    for batch in batches:
        origin = batch["start_ms"] * 1000
        events.append(
            {
                "name": f"falconet/batch {batch['index']} {batch['part']}",
                "cat": "user_annotation",
                "ph": "X",
                "ts": origin,
                "dur": batch["ms"] * 1000,
                "pid": pid,
                "tid": 0,
                "args": {"epoch": batch["epoch"], "images": batch["images"]},
            }
        )
        events.extend(
            {
                "name": f"falconet/{phase['name']}",
                "cat": "user_annotation",
                "ph": "X",
                "ts": origin + phase["start_ms"] * 1000,
                "dur": phase["ms"] * 1000,
                "pid": pid,
                "tid": 0,
            }
            for phase in batch["phases"]
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}
