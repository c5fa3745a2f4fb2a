"""The built-in ``eager`` graph backend: the step op by op, as written.

It never declines, so it is what ``graph=auto`` ends at and what every other backend falls
back to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from falconet.contract import GraphContext

if TYPE_CHECKING:
    from falconet.contract import StepParts, TrainStep


class EagerBackend:
    """Run the step op by op (:class:`falconet.graph_backends.eager_step.EagerStep`)."""

    name = "eager"
    summary = "the step op by op (the fallback of every other backend)"
    priority = 0
    replays = False

    def decline_reason(self, context: GraphContext) -> str | None:
        return None

    def build_step(self, parts: StepParts, context: GraphContext) -> TrainStep:
        from falconet.graph_backends.eager_step import EagerStep

        return EagerStep(parts)
