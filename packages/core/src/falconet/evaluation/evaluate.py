"""Evaluate detections with a registered backend, after validating them once for all backends.

This is the dispatch over the plugin registry, above :mod:`falconet.plugins`; the package's
face (:mod:`falconet.evaluation`) holds the backends' contract only, so a backend importing it
imports no plugin manager.
"""

from __future__ import annotations

from falconet.evaluation.contract import (
    Detections,
    EvalBackendUnavailable,
    EvalResult,
    GroundTruth,
)
from falconet.plugins import Plugins, get_plugins


def default_backend_name(plugins: Plugins | None = None) -> str:
    """``eval_backend=auto``: the installed backend of highest ``priority`` whose library
    imports (pycocotools, priority 0, is always there). Every backend returns pycocotools'
    numbers (the parity suite), so the choice changes the speed only."""
    plugins = plugins or get_plugins()
    ranked = sorted(plugins.eval_backends.entries(), key=lambda e: (-e.item.priority, e.name))
    for entry in ranked:
        try:
            entry.item.version()
        except EvalBackendUnavailable:
            continue
        return entry.name
    return "pycocotools"


def evaluate(
    ground_truth: GroundTruth,
    detections: Detections,
    *,
    backend: str | None = None,
    threads: int | None = None,
    plugins: Plugins | None = None,
) -> EvalResult:
    """COCO bbox evaluation of ``detections`` by the backend named (default: the fastest).

    Detections for image or category ids the ground truth does not hold raise
    :class:`~falconet.evaluation.contract.EvalInputError` naming them, whatever the backend.
    """
    plugins = plugins or get_plugins()
    detections.check_against(ground_truth)
    name = backend or default_backend_name(plugins)
    return plugins.eval_backends.get(name).evaluate(ground_truth, detections, threads=threads)
