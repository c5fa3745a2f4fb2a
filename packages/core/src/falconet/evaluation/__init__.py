"""COCO-style evaluation: the data contract, the accumulator, the reference backend.

Backends are registered through ``register_eval_backends``; :func:`evaluate` validates the
input once, for every backend, then dispatches by name.
"""

from falconet.evaluation.contract import (
    STAT_KEYS,
    Detections,
    EvalInputError,
    EvalResult,
    GroundTruth,
)
from falconet.evaluation.evaluate import default_backend_name, evaluate

__all__ = [
    "STAT_KEYS",
    "Detections",
    "EvalInputError",
    "EvalResult",
    "GroundTruth",
    "default_backend_name",
    "evaluate",
]
