"""The known-answer cases catch a backend that breaks a rule of the protocol, even one that is
pycocotools underneath: they compare with hand-derived numbers, not with another backend."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from falconet.evaluation.pycocotools_backend import PycocotoolsBackend
from falconet_testing.contracts import EvalBackendContract
from falconet_testing.known_answers import KNOWN_ANSWERS


class CrowdBlind(PycocotoolsBackend):
    """pycocotools with every crowd flag dropped: crowd regions count as boxes to find."""

    name = "crowd-blind"

    def evaluate(self, ground_truth, detections, *, threads=None):
        no_crowd = replace(ground_truth, ann_iscrowd=np.zeros_like(ground_truth.ann_iscrowd))
        return super().evaluate(no_crowd, detections, threads=threads)


class LowestScoreFirst(PycocotoolsBackend):
    """pycocotools with the ranking turned upside down."""

    name = "lowest-score-first"

    def evaluate(self, ground_truth, detections, *, threads=None):
        upside_down = replace(detections, scores=1.0 - detections.scores)
        return super().evaluate(ground_truth, upside_down, threads=threads)


class Contract(EvalBackendContract):
    backend = PycocotoolsBackend()


@pytest.mark.parametrize(
    ("backend", "case"),
    [
        (CrowdBlind(), "crowd-region-ignores-what-falls-in-it"),
        (LowestScoreFirst(), "duplicate-matched-greedily-by-score"),
    ],
)
def test_a_backend_that_breaks_a_rule_fails_its_known_answer(backend, case):
    contract = Contract()
    contract.backend = backend
    with pytest.raises(AssertionError, match=f"the hand-derived answers of {case}"):
        contract.test_matches_known_answers(case)


def test_every_case_names_each_class_in_ascending_id_order():
    for case, make in KNOWN_ANSWERS.items():
        known = make()
        assert list(known.per_class_ap) == list(known.ground_truth.names_by_sorted_id()), case
        assert list(known.per_class_ap50) == list(known.per_class_ap), case
