"""The plugin contract: what a plugin's items are, and what a graph backend is handed.

Plugins import these names from here. Every module of this package imports the runtime (torch,
the trainer, the evaluation) only for type checking, so importing the contract costs nothing
and no core module it names can import it back into a cycle
(``packages/core/tests/test_import_cycles.py``).

* :mod:`falconet.contract.kinds`: one protocol per kind of registered item (model families,
  assigners, eval, precision and graph backends, callbacks) and the typed values they
  exchange (predictions, assignments, export graphs, precision and graph contexts);
* :mod:`falconet.contract.step`: the training step's parts, the step's interface, its output
  and its capture statistics.

The hook specs are :mod:`falconet.hookspecs`; the eval backends' data contract (numpy arrays in,
COCO stats out) is :mod:`falconet.evaluation.contract`; the reference step a backend may build
on is :class:`falconet.graph_backends.eager_step.EagerStep`.
"""

from falconet.contract.kinds import (
    Assigner,
    Assignment,
    Callback,
    CallbackFactory,
    CheckpointingFamily,
    EvalBackend,
    ExportableFamily,
    ExportGraph,
    GraphBackend,
    GraphContext,
    ModelFamily,
    PrecisionBackend,
    PrecisionContext,
    Predictions,
    validated_keys,
)
from falconet.contract.step import (
    NO_CAPTURES,
    CaptureStats,
    LossFn,
    Progress,
    StepOutput,
    StepParts,
    TrainStep,
)

__all__ = [
    "NO_CAPTURES",
    "Assigner",
    "Assignment",
    "Callback",
    "CallbackFactory",
    "CaptureStats",
    "CheckpointingFamily",
    "EvalBackend",
    "ExportGraph",
    "ExportableFamily",
    "GraphBackend",
    "GraphContext",
    "LossFn",
    "ModelFamily",
    "PrecisionBackend",
    "PrecisionContext",
    "Predictions",
    "Progress",
    "StepOutput",
    "StepParts",
    "TrainStep",
    "validated_keys",
]
