"""COCO-style evaluation: the data contract, the accumulator, the reference backend.

Backends are registered through ``register_eval_backends``; this face holds what a backend
needs (:mod:`falconet.evaluation.contract`), and :func:`falconet.evaluation.evaluate.evaluate`
validates the input once, for every backend, then dispatches by name.
"""

from falconet.evaluation.contract import (
    STAT_KEYS,
    Detections,
    EvalBackendUnavailable,
    EvalInputError,
    EvalResult,
    GroundTruth,
    require_library,
)

__all__ = [
    "STAT_KEYS",
    "Detections",
    "EvalBackendUnavailable",
    "EvalInputError",
    "EvalResult",
    "GroundTruth",
    "require_library",
]
