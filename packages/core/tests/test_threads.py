"""``threads=``: the cores a process may use (affinity, cgroup quota), its share per rank, and
the counts set for torch, OpenMP and OpenCV."""

from __future__ import annotations

import os

import cv2
import pytest
import torch

from falconet.training import threads
from falconet.training.config import TrainConfig


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "150000 100000\n"}, 1.5),  # cgroup v2: 1.5 CPUs
        ({"cpu.max": "max 100000\n"}, None),  # v2, no quota
        ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),  # v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),  # none readable
    ],
)
def test_the_cgroup_quota_is_read_from_either_version(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert threads.cgroup_quota(tmp_path) == quota


def test_usable_cores_are_the_affinity_capped_by_the_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert threads.usable_cores(tmp_path) == 64  # no quota: the affinity
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert threads.usable_cores(tmp_path) == 2  # 1.5 CPUs: two threads, not 64
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert threads.usable_cores(tmp_path) == 1


def test_auto_shares_the_cores_among_a_nodes_ranks_and_a_number_is_taken_as_given():
    assert threads.thread_count(0, 16) == 16
    assert threads.thread_count(0, 16, local_ranks=8) == 2
    assert threads.thread_count(0, 2, local_ranks=8) == 1
    assert threads.thread_count(3, 16, local_ranks=8) == 3


def test_apply_sets_torch_openmp_and_opencv(monkeypatch, caplog):
    before_torch, before_cv = torch.get_num_threads(), cv2.getNumThreads()
    monkeypatch.setenv("OMP_NUM_THREADS", "99")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(threads, "usable_cores", lambda: 6)
    try:
        with caplog.at_level("INFO", logger="falconet.train"):
            assert threads.apply_threads(0) == 3
        assert torch.get_num_threads() == 3 and cv2.getNumThreads() == 3
        assert os.environ["OMP_NUM_THREADS"] == "3"
        assert "6 usable core(s), 2 rank(s) a node" in caplog.text
        assert threads.apply_threads(1) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before_torch)
        cv2.setNumThreads(before_cv)


def test_the_key_refuses_a_negative_count():
    assert TrainConfig(threads=4).threads == 4
    with pytest.raises(ValueError, match="threads"):
        TrainConfig(threads=-1)
