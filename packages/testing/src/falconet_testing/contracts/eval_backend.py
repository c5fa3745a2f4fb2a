"""What every eval backend must do: give the protocol's answers, and pycocotools' bit for bit.

Two checks, of different kinds:

* **known answers**: on the small hand-built cases of
  :data:`falconet_testing.known_answers.KNOWN_ANSWERS`, the 12 stats and per-class AP and AP50
  equal numbers derived by hand from the COCO protocol (to 1e-12: float sums of rationals).
  No backend produced them, so this checks pycocotools too;
* **parity**: on the realistic cases of :data:`falconet_testing.eval_cases.PARITY_CASES`
  (COCO128's ground truth, generated detections), the same values equal pycocotools' bit for
  bit. The reference itself skips this one: it would compare pycocotools with itself.

A backend that genuinely differs sets ``tolerance`` to the bound it documents, with the reason.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import pytest

from falconet.contract import EvalBackend
from falconet.evaluation.contract import STAT_KEYS, EvalResult
from falconet.evaluation.pycocotools_backend import PycocotoolsBackend
from falconet_testing.eval_cases import PARITY_CASES
from falconet_testing.known_answers import KNOWN_ANSWERS

KNOWN_ANSWER_ROUNDING = 1e-12
"""How far a float mean of the 101 points may land from the exact rational (e.g. 1 - 2e-16)."""


@functools.cache
def reference_result(case: str) -> EvalResult:
    """pycocotools' answer for a case (cached: the suite compares several backends to it)."""
    ground_truth, detections = PARITY_CASES[case]()
    return PycocotoolsBackend().evaluate(ground_truth, detections)


def assert_same_result(
    got: EvalResult, want: EvalResult, tolerance: float = 0.0, source: str = "pycocotools"
) -> None:
    """Stats, per-class AP and AP50 equal (within ``tolerance``), with the differences named."""
    assert_same_values(got, want.stats, want.per_class_ap, want.per_class_ap50, tolerance, source)


def assert_same_values(
    got: EvalResult,
    stats: Mapping[str, float],
    per_class_ap: Mapping[str, float],
    per_class_ap50: Mapping[str, float],
    tolerance: float,
    source: str,
) -> None:
    for what, g, w in (
        ("stats", got.stats, stats),
        ("per-class AP", got.per_class_ap, per_class_ap),
        ("per-class AP50", got.per_class_ap50, per_class_ap50),
    ):
        assert list(g) == list(w), f"{what}: keys differ"
        diff = {k: (g[k], w[k]) for k in w if abs(g[k] - w[k]) > tolerance}
        assert not diff, f"{what} differ from {source} (got, want): {diff}"


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

    @pytest.mark.parametrize("case", list(KNOWN_ANSWERS))
    def test_matches_known_answers(self, case: str) -> None:
        known = KNOWN_ANSWERS[case]()
        got = self.backend.evaluate(known.ground_truth, known.detections)
        assert got.backend == self.backend.name
        assert got.backend_version == self.backend.version()
        assert tuple(got.stats) == STAT_KEYS
        assert_same_values(
            got,
            known.stats,
            known.per_class_ap,
            known.per_class_ap50,
            max(self.tolerance, KNOWN_ANSWER_ROUNDING),
            f"the hand-derived answers of {case}",
        )

    @pytest.mark.parametrize("case", list(PARITY_CASES))
    def test_matches_pycocotools(self, case: str) -> None:
        if isinstance(self.backend, PycocotoolsBackend):
            pytest.skip("the reference itself: test_matches_known_answers checks it")
        ground_truth, detections = PARITY_CASES[case]()
        got = self.backend.evaluate(ground_truth, detections)
        assert got.backend == self.backend.name
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
