"""Repeated trials: their mean and spread, one verdict (``mixed`` when they disagree), and the
comparison of two profiles that counts a difference only beyond the trials' spread.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from falconet_profiler.report import HEADLINE, headline
from falconet_profiler.verdict import combine
from falconet_profiler.window import describe

NOISE_FLOOR = 0.05
"""With one trial on a side the spread is unknown: a difference counts beyond 5%."""


def aggregate_of(trials: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per :data:`HEADLINE` figure measured in every trial: mean, median, std, min, max, n."""
    out = {}
    for key in HEADLINE:
        values = [t[key] for t in trials if t.get(key) is not None]
        if values and len(values) == len(trials):
            out[key] = {**describe(values), "n": len(values)}
    return out


def with_trials(doc: dict[str, Any]) -> dict[str, Any]:
    """Fill a single run's ``trials`` (itself) and ``aggregate``."""
    doc["trials"] = [headline(doc)]
    doc["aggregate"] = aggregate_of(doc["trials"])
    return doc


def combine_trials(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One profile for N trials: the detail (batches, kernels, lanes) of the trial with the
    median step time, every trial's headline, their aggregate, and the combined verdict."""
    if not docs:
        raise ValueError("no trials to combine")
    ordered = sorted(docs, key=lambda d: d["evidence"]["step_ms"])
    doc = copy.deepcopy(dict(ordered[(len(ordered) - 1) // 2]))
    doc["trials"] = [headline(d) for d in docs]
    doc["aggregate"] = aggregate_of(doc["trials"])
    names = [d["verdict"]["name"] for d in docs]
    name = combine(names)
    doc["verdict"]["trials"] = names
    if name == "mixed":
        counts = {n: names.count(n) for n in dict.fromkeys(names)}
        levers: list[dict[str, Any]] = []
        for d in docs:
            levers += [lever for lever in d["verdict"]["levers"] if lever not in levers]
        doc["verdict"].update(
            name="mixed",
            reason="the trials disagree: "
            + ", ".join(f"{n} in {c} of {len(names)}" for n, c in counts.items()),
            levers=levers,
        )
    return doc


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Figures of B against A: per figure both means, the change, and whether it counts.

    A change counts when the two trials' ranges (min to max) do not overlap; when either side
    has one trial (no spread), when it exceeds :data:`NOISE_FLOOR` of the larger mean.
    """
    rows = []
    for key in HEADLINE:
        left, right = a["aggregate"].get(key), b["aggregate"].get(key)
        if left is None or right is None:
            continue
        delta = right["mean"] - left["mean"]
        known = left["n"] > 1 and right["n"] > 1
        if known:
            counts = right["min"] > left["max"] or right["max"] < left["min"]
        else:
            counts = abs(delta) > NOISE_FLOOR * max(abs(left["mean"]), abs(right["mean"]))
        rows.append(
            {
                "figure": key,
                "a": left["mean"],
                "b": right["mean"],
                "change": delta,
                "relative": delta / left["mean"] if left["mean"] else None,
                "a_spread": [left["min"], left["max"]],
                "b_spread": [right["min"], right["max"]],
                "spread_known": known,
                "counts": counts,
            }
        )
    return {
        "a": {
            "run_dir": a["run"]["run_dir"],
            "verdict": a["verdict"]["name"],
            "trials": len(a["trials"]),
        },
        "b": {
            "run_dir": b["run"]["run_dir"],
            "verdict": b["verdict"]["name"],
            "trials": len(b["trials"]),
        },
        "figures": rows,
        "changed": [row["figure"] for row in rows if row["counts"]],
    }
