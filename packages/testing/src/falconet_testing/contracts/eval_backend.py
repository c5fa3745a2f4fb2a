"""What every eval backend must do: return exactly the reference's numbers.

The reference is pycocotools (falconet's built-in ``pycocotools`` backend). A backend must match
its 12 stats and per-class AP and AP50 bit for bit on every case of
:data:`falconet_testing.eval_cases.PARITY_CASES`. A backend that genuinely differs sets
``tolerance`` to the bound it documents, with the reason.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import numpy as np
import pytest

from falconet.evaluation.contract import STAT_KEYS, EvalResult
from falconet.evaluation.pycocotools_backend import PycocotoolsBackend
from falconet.interfaces import EvalBackend
from falconet_testing.eval_cases import PARITY_CASES


@functools.cache
def reference_result(case: str) -> EvalResult:
    """pycocotools' answer for a case (cached: the suite compares several backends to it)."""
    ground_truth, detections = PARITY_CASES[case]()
    return PycocotoolsBackend().evaluate(ground_truth, detections)


def assert_same_result(got: EvalResult, want: EvalResult, tolerance: float = 0.0) -> None:
    """Stats, per-class AP and AP50 equal (within ``tolerance``), with the differences named."""
    for what, g, w in (
        ("stats", got.stats, want.stats),
        ("per-class AP", got.per_class_ap, want.per_class_ap),
        ("per-class AP50", got.per_class_ap50, want.per_class_ap50),
    ):
        assert list(g) == list(w), f"{what}: keys differ"
        diff = {k: (g[k], w[k]) for k in w if abs(g[k] - w[k]) > tolerance}
        assert not diff, f"{what} differ from pycocotools (got, want): {diff}"


class EvalBackendContract:
    """Subclass with ``backend`` (an instance your plugin registers)."""

    backend: ClassVar[EvalBackend]
    tolerance: ClassVar[float] = 0.0

    def test_satisfies_interface(self) -> None:
        assert isinstance(self.backend, EvalBackend)
        priority = self.backend.priority
        assert isinstance(priority, int) and not isinstance(priority, bool), (
            f"{self.backend.name}: priority (the order of eval_backend=auto) must be an int"
        )
        assert isinstance(self.backend.version(), str) and self.backend.version()

    @pytest.mark.parametrize("case", list(PARITY_CASES))
    def test_matches_pycocotools(self, case: str) -> None:
        ground_truth, detections = PARITY_CASES[case]()
        got = self.backend.evaluate(ground_truth, detections)
        assert got.backend == self.backend.name
        assert got.backend_version == self.backend.version()
        assert tuple(got.stats) == STAT_KEYS
        assert_same_result(got, reference_result(case), self.tolerance)

    def test_no_detections_scores_zero(self) -> None:
        ground_truth, detections = PARITY_CASES["no-detections"]()
        stats = self.backend.evaluate(ground_truth, detections).stats
        assert all(v == 0.0 for v in stats.values()), stats

    def test_threads_do_not_change_the_result(self) -> None:
        ground_truth, detections = PARITY_CASES["generated-seed0"]()
        one = self.backend.evaluate(ground_truth, detections, threads=1)
        two = self.backend.evaluate(ground_truth, detections, threads=2)
        assert_same_result(one, two)

    def test_detections_are_not_modified(self) -> None:
        ground_truth, detections = PARITY_CASES["generated-seed1"]()
        before = [a.copy() for a in (detections.boxes, detections.scores, ground_truth.ann_boxes)]
        self.backend.evaluate(ground_truth, detections)
        after = (detections.boxes, detections.scores, ground_truth.ann_boxes)
        assert all(np.array_equal(b, a) for b, a in zip(before, after, strict=True))
