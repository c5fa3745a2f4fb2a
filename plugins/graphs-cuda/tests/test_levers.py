"""falconet-graphs-cuda's levers: the graphs for a launch-bound step, the fused step's two keys
for a busy GPU that replays the whole step, and falconet-testing's lever contract."""

from __future__ import annotations

import pytest

from falconet.levers import LeverContext
from falconet_graphs_cuda.levers import (
    LEVERS,
    bn_silu_triton,
    cuda_graph,
    fuse_inductor_loss,
    whole_step,
)
from falconet_testing.contracts import LeverContract

BUSY = {"gpu_busy": 0.9, "tensor_core_share": 0.7, "peak_reserved_fraction": 0.4}


class TestGraphsCudaLevers(LeverContract):
    levers = LEVERS
    options = (
        {},
        {"fuse": "inductor-loss"},
        {"bn_silu": "triton"},
        {"fuse": "inductor-all"},
    )


def sets(levers, context):
    found = [lever.suggest(context) for lever in levers]
    return [f"{s.key}={s.value}" for s in found if s is not None]


@pytest.mark.parametrize(
    ("graph", "levers"),
    [
        ("eager", ["graph=cuda-graph", "graph=whole-step"]),
        ("compile", ["graph=cuda-graph", "graph=whole-step"]),
        ("cuda-graph", ["graph=whole-step"]),  # next: the loss and optimizer too
        ("whole-step", []),
    ],
)
def test_graphs_for_a_launch_bound_step(graph, levers):
    context = LeverContext(verdict="host-launch", graph=graph)
    assert sets((cuda_graph, whole_step), context) == levers


@pytest.mark.parametrize(
    ("fuse", "bn_silu", "levers"),
    [
        ("none", "native", ["bn_silu=triton", "fuse=inductor-loss"]),
        ("inductor-loss", "native", ["bn_silu=triton"]),
        ("none", "triton", ["fuse=inductor-loss"]),
        ("inductor-loss", "triton", []),  # already the fastest step that kept the mAP
        ("inductor-all", "native", []),  # a compiled network: bn_silu=triton does not combine
    ],
)
def test_fused_step_levers_add_what_the_run_lacks(fuse, bn_silu, levers):
    context = LeverContext(
        verdict="compute",
        evidence=BUSY,
        graph="whole-step",
        precision="fp16",
        options={"fuse": fuse, "bn_silu": bn_silu},
    )
    assert sets((bn_silu_triton, fuse_inductor_loss), context) == levers


@pytest.mark.parametrize(
    "change", [{"graph": "cuda-graph"}, {"device": "cpu"}, {"precision": "fp32"}]
)
def test_fused_step_levers_need_the_whole_step_on_a_gpu_in_half_precision(change):
    context = LeverContext(
        **{"verdict": "compute", "evidence": BUSY, "graph": "whole-step", **change}
    )
    assert sets((bn_silu_triton, fuse_inductor_loss), context) == []


def test_fused_step_reason_follows_the_precision():
    """The levers quote the fp16 overfit check; in a bf16 run they add bf16's, which
    checked the two levers together only (docs/performance.md)."""

    def reasons(precision):
        context = LeverContext(verdict="compute", graph="whole-step", precision=precision)
        return [lever.suggest(context).why for lever in (bn_silu_triton, fuse_inductor_loss)]

    for why in reasons("fp16"):
        assert "kept the mAP" in why and "in bf16" not in why
    for why in reasons("bf16"):
        assert "in bf16 (this run) the two were checked together only" in why
