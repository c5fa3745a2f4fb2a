"""The detection accumulator: batches in, the evaluation contract out, merged across ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from falconet.evaluation import EvalInputError
from falconet.evaluation.accumulator import DetectionAccumulator

CATEGORY_IDS = [1, 3, 7]  # contiguous label i -> category id CATEGORY_IDS[i]


def output(boxes, scores, labels):
    return {
        "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
        "scores": torch.tensor(scores, dtype=torch.float32),
        "labels": torch.tensor(labels, dtype=torch.int64),
    }


def test_batches_become_xywh_detections_with_category_ids():
    acc = DetectionAccumulator(CATEGORY_IDS)
    acc.add(
        [10, 11], [output([[0, 0, 10, 20], [5, 5, 6, 8]], [0.75, 0.25], [0, 2]), output([], [], [])]
    )
    acc.add([12], [output([[1.5, 2.5, 4.5, 8.5]], [0.125], [1])])
    dets = acc.detections()
    assert acc.images == [10, 11, 12]
    np.testing.assert_array_equal(dets.image_ids, [10, 10, 12])
    np.testing.assert_array_equal(dets.category_ids, [1, 7, 3])
    np.testing.assert_array_equal(dets.boxes, [[0, 0, 10, 20], [5, 5, 1, 3], [1.5, 2.5, 3, 6]])
    np.testing.assert_array_equal(dets.scores, [0.75, 0.25, 0.125])  # float32-exact values
    assert dets.boxes.dtype == np.float64


def test_numpy_outputs_are_accepted_too():
    acc = DetectionAccumulator(CATEGORY_IDS)
    acc.add(
        [1],
        [{"boxes": np.array([[0.0, 0, 2, 2]]), "scores": np.array([0.5]), "labels": np.array([1])}],
    )
    assert acc.detections().category_ids.tolist() == [3]


def test_label_outside_the_categories_is_an_error():
    acc = DetectionAccumulator(CATEGORY_IDS)
    acc.add([1], [output([[0, 0, 1, 1]], [0.5], [3])])
    with pytest.raises(EvalInputError, match=r"labels must be in 0\.\.2"):
        acc.detections()


def test_merge_keeps_each_image_once_like_a_padded_distributed_sampler():
    rank0, rank1 = DetectionAccumulator(CATEGORY_IDS), DetectionAccumulator(CATEGORY_IDS)
    rank0.add(
        [1, 3],
        [output([[0, 0, 1, 1]], [0.5], [0]), output([[0, 0, 3, 3]] * 2, [0.375, 0.25], [1, 1])],
    )
    rank1.add(
        [2, 1],
        [
            output([[0, 0, 2, 2]], [0.125], [2]),  # image 1 again: the sampler's pad
            output([[9, 9, 9, 9]], [0.75], [0]),
        ],
    )
    states = [rank0.state(), rank1.state()]
    assert all(isinstance(v, np.ndarray) for s in states for v in s.values())  # picklable
    dets = DetectionAccumulator.merge(states, CATEGORY_IDS)
    np.testing.assert_array_equal(dets.image_ids, [1, 3, 3, 2])
    np.testing.assert_array_equal(dets.scores, [0.5, 0.375, 0.25, 0.125])


def test_merging_disjoint_ranks_equals_one_process_seeing_everything():
    batches = [
        ([4, 5], [output([[0, 0, 1, 1]], [0.5], [0]), output([[1, 1, 2, 2]], [0.625], [2])]),
        ([6], [output([[2, 2, 6, 5], [0, 1, 2, 3]], [0.25, 0.125], [1, 0])]),
    ]
    single, ranks = DetectionAccumulator(CATEGORY_IDS), []
    for ids, outs in batches:
        single.add(ids, outs)
        rank = DetectionAccumulator(CATEGORY_IDS)
        rank.add(ids, outs)
        ranks.append(rank.state())
    merged, once = DetectionAccumulator.merge(ranks, CATEGORY_IDS), single.detections()
    for field in ("image_ids", "category_ids", "boxes", "scores"):
        np.testing.assert_array_equal(getattr(merged, field), getattr(once, field))
    np.testing.assert_array_equal(once.boxes[-1], [0, 1, 2, 2])  # xyxy [0, 1, 2, 3] as xywh
