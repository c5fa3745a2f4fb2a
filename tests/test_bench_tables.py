"""tools/bench_train.py's tables: a falconet arm whose graph backend declined (whole-step in
fp16, cuda-graph on the CPU) runs eager, and its row says so instead of passing for the
backend it asked for (the first H200 run had such a row)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def bench_train(load_tool):
    return load_tool("bench_train")


RESULTS = [
    {"arm": "falconet", "batch": 16, "measure": "step", "step_ms": 31.1, "graph": "eager"},
    {
        "arm": "falconet:graph=cuda-graph",
        "batch": 16,
        "measure": "step",
        "step_ms": 15.5,
        "graph": "cuda-graph",
    },
    {
        "arm": "falconet:graph=whole-step",
        "batch": 16,
        "measure": "step",
        "step_ms": 30.2,
        "graph": "eager",
    },
    {"arm": "ultralytics", "batch": 16, "measure": "e2e", "img_s": 163.0},
]
ARMS = ["falconet", "falconet:graph=cuda-graph", "falconet:graph=whole-step", "ultralytics"]


def test_a_declined_backend_is_named_in_its_row(bench_train):
    rows = bench_train.speed_table(RESULTS, ARMS, [16]).splitlines()[2:]
    assert rows[0].startswith("| falconet (ran graph=eager) | 16 | ")  # graph=auto's choice
    assert rows[1].startswith("| falconet:graph=cuda-graph | 16 | ")
    assert rows[2].startswith("| falconet:graph=whole-step (ran graph=eager) | 16 | - | - | 30.2 ")
    assert rows[3].startswith("| ultralytics | 16 | 163 | 1.00x ")


def test_results_without_the_graph_field_keep_their_label(bench_train):
    old = [{k: v for k, v in r.items() if k != "graph"} for r in RESULTS]
    assert bench_train.arm_label(old, "falconet:graph=whole-step") == "falconet:graph=whole-step"


def test_an_arms_environment_settings_go_to_its_environment_not_its_keys(bench_train):
    arm = "falconet:fuse=inductor-all:TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1:batch=8"
    assert bench_train.parse_arm(arm) == ("falconet", {"fuse": "inductor-all", "batch": "8"})
    assert bench_train.arm_env(arm) == {"TORCHINDUCTOR_COORDINATE_DESCENT_TUNING": "1"}
    assert bench_train.arm_env("falconet:graph=eager") == {}
    tiled = "falconet:bn_silu=triton:FALCONET_BN_SILU_MAP_WARPS=8"
    assert bench_train.parse_arm(tiled) == ("falconet", {"bn_silu": "triton"})
    assert bench_train.arm_env(tiled) == {"FALCONET_BN_SILU_MAP_WARPS": "8"}


def test_gpu_time_tells_lost_overlap_from_more_kernel_time(bench_train):
    """Two steps of a main stream's kernels with a second stream's beside them (microseconds):
    the same kernels run one after the other instead are as many kernel-milliseconds but more
    busy ones, the overlap gone."""
    side_by_side = [(0, 600), (100, 400), (1000, 1600), (1100, 1400)]
    in_line = [(0, 600), (600, 900), (1000, 1600), (1600, 1900)]
    assert bench_train.gpu_time(side_by_side, 2) == {
        "busy_ms": 0.6,
        "kernel_ms": 0.9,
        "overlap_ms": 0.3,
    }
    assert bench_train.gpu_time(in_line, 2) == {"busy_ms": 0.9, "kernel_ms": 0.9, "overlap_ms": 0.0}
