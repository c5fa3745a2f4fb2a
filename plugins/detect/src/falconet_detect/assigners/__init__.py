"""Label assigners: standalone no-grad functions ``(Predictions, Targets) -> Assignment``
(:mod:`falconet.contract`, :mod:`falconet.data.targets`).

What the plugin registers is a :class:`LazyAssigner`: its name and summary cost nothing, and
the implementation (which imports torch) loads on the first call. Each implementation declares
where it is static-shaped and reads nothing back (``static_on``), which the families ask.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from falconet.contract import Assignment, Predictions
    from falconet.data.targets import Targets


class LazyAssigner:
    """A registered assigner whose implementation ``module:Class`` is imported when first
    called or asked where it is static."""

    def __init__(self, name: str, summary: str, target: str, **options: Any) -> None:
        self.name, self.summary, self._target, self._options = name, summary, target, options
        self._impl: Any = None

    def __call__(self, predictions: Predictions, targets: Targets) -> Assignment:
        return self._implementation()(predictions, targets)

    def static_on(self, device: torch.device) -> bool:
        """The implementation's own (:meth:`falconet.contract.Assigner.static_on`)."""
        return self._implementation().static_on(device)

    def _implementation(self) -> Any:
        if self._impl is None:
            module, cls = self._target.split(":")
            self._impl = getattr(import_module(module), cls)(**self._options)
        return self._impl


TAL = LazyAssigner(
    "tal",
    "task-aligned top-k (cls^alpha * IoU^beta); static-shaped, no host sync",
    "falconet_detect.assigners.tal:TaskAlignedAssigner",
)
SIMOTA = LazyAssigner(
    "simota",
    "YOLOX dynamic-k by cls + IoU cost; static-shaped, no host sync",
    "falconet_detect.assigners.simota:SimOTAAssigner",
)
HUNGARIAN = LazyAssigner(
    "hungarian",
    "one anchor per box at minimum cost: on the GPU without a host sync, else scipy",
    "falconet_detect.assigners.hungarian:HungarianAssigner",
)
