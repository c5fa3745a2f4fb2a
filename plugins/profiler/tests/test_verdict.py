"""The verdict rules on synthetic evidence: one case per verdict, the order of the rules, the
thresholds' edges, the levers, the CPU case and repeated trials."""

from __future__ import annotations

import pytest

from falconet_profiler.verdict import THRESHOLDS, Context, combine, decide

GPU = Context(
    device="cuda",
    graph="eager",
    precision="bf16",
    batch=16,
    workers=8,
    cache="none",
    cpu_count=16,
    graphs=frozenset({"eager", "compile", "cuda-graph"}),
)


def evidence(**changes):
    """A healthy GPU step: busy 90%, no loader wait, no allocation, 40% of memory."""
    base = {
        "step_ms": 50.0,
        "img_per_s": 320.0,
        "loader_wait_fraction": 0.02,
        "gpu_busy": 0.90,
        "kernels_per_step": 900.0,
        "mean_kernel_us": 45.0,
        "host_syncs_per_step": 0.1,
        "cuda_malloc_per_step": 0.0,
        "alloc_retries": 0,
        "peak_reserved_fraction": 0.4,
        "tensor_core_share": 0.7,
    }
    return {**base, **changes}


def sets(verdict):
    return [lever["set"] for lever in verdict["levers"]]


def test_dataloader():
    verdict = decide(evidence(loader_wait_fraction=0.45, gpu_busy=0.4), GPU)
    assert verdict["name"] == "dataloader" and "45%" in verdict["reason"]
    assert sets(verdict) == ["workers=16", "cache=gpu"]  # on a GPU, augment there
    assert any(a.startswith("host-launch") for a in verdict["also"])  # the idle GPU follows


def test_host_launch_with_its_evidence():
    verdict = decide(
        evidence(gpu_busy=0.21, kernels_per_step=6742, mean_kernel_us=4.1, host_syncs_per_step=78),
        GPU,
    )
    assert verdict["name"] == "host-launch"
    assert "21%" in verdict["reason"] and "6742 kernels per step" in verdict["reason"]
    assert "(short)" in verdict["reason"] and "78.0 host syncs" in verdict["reason"]
    assert sets(verdict) == [
        "graph=cuda-graph",
        "graph=whole-step",
        "graph=compile",
        "batch=32",
    ]


def test_compute():
    verdict = decide(evidence(), GPU)
    assert verdict["name"] == "compute" and verdict["also"] == []
    fp32 = decide(evidence(), Context(device="cuda", precision="fp32"))
    assert sets(fp32) == ["amp_dtype=bf16"]
    low_tensor_cores = decide(evidence(tensor_core_share=0.2), GPU)
    assert sets(low_tensor_cores) == ["graph=compile"]
    whole_step = Context(device="cuda", graph="whole-step")
    fused_step = ["bn_silu=triton", "fuse=inductor-loss"]
    assert sets(decide(evidence(), whole_step)) == fused_step
    fused = Context(device="cuda", graph="whole-step", fuse="inductor")
    assert sets(decide(evidence(), fused)) == []
    with_fp16 = Context(device="cuda", graph="whole-step", precisions=frozenset({"bf16", "fp16"}))
    assert sets(decide(evidence(), with_fp16)) == ["amp_dtype=fp16", *fused_step]
    in_fp16 = Context(device="cuda", precision="fp16", precisions=frozenset({"bf16", "fp16"}))
    assert sets(decide(evidence(), in_fp16)) == []


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
    context = Context(
        device="cuda", graph="whole-step", precision="fp16", fuse=fuse, bn_silu=bn_silu
    )
    assert sets(decide(evidence(), context)) == levers


def test_fused_step_reason_follows_the_precision():
    """The levers quote the fp16 overfit check; in a bf16 run they add bf16's, which
    checked the two levers together only (docs/performance.md)."""

    def reasons(precision):
        context = Context(device="cuda", graph="whole-step", precision=precision)
        return [lever["why"] for lever in decide(evidence(), context)["levers"]]

    for why in reasons("fp16"):
        assert "kept the mAP" in why and "in bf16" not in why
    for why in reasons("bf16"):
        assert "in bf16 (this run) the two were checked together only" in why


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"alloc_retries": 3}, "retried 3 times"),
        ({"cuda_malloc_per_step": 2.5}, "2.5 cudaMalloc calls per step"),
        ({"peak_reserved_fraction": 0.97}, "97% of the device"),
    ],
)
def test_memory_pressure(change, said):
    verdict = decide(evidence(**change), GPU)
    assert verdict["name"] == "memory-pressure" and said in verdict["reason"]
    assert sets(verdict) == ["batch=8"]


def test_rules_apply_in_order_and_at_their_thresholds():
    at = THRESHOLDS
    assert decide(evidence(loader_wait_fraction=at["loader_wait_fraction"]), GPU)["name"] == (
        "dataloader"
    )
    assert decide(evidence(gpu_busy=at["gpu_busy"]), GPU)["name"] == "compute"
    assert decide(evidence(gpu_busy=at["gpu_busy"] - 0.01), GPU)["name"] == "host-launch"
    both = decide(evidence(loader_wait_fraction=0.5, alloc_retries=1), GPU)
    assert both["name"] == "dataloader" and both["also"][0].startswith("memory-pressure")
    pressure_and_idle = decide(evidence(alloc_retries=1, gpu_busy=0.3), GPU)
    assert pressure_and_idle["name"] == "memory-pressure"


def test_levers_leave_out_what_is_already_set_and_say_what_is_missing():
    graphed = Context(graph="whole-step", batch=64, workers=16, cpu_count=16, cache="ram")
    verdict = decide(evidence(gpu_busy=0.5, peak_reserved_fraction=0.8), graphed)
    assert verdict["levers"] == []  # the whole step graphed, memory too full to double the batch
    network_only = decide(evidence(gpu_busy=0.5), Context(graph="cuda-graph"))
    assert sets(network_only)[0] == "graph=whole-step"  # next: the loss and optimizer too
    waiting = decide(evidence(loader_wait_fraction=0.3), graphed)
    assert sets(waiting) == ["cache=gpu"]  # every worker busy: the data moves to the GPU
    on_gpu = Context(graph="whole-step", workers=16, cpu_count=16, cache="gpu")
    assert decide(evidence(loader_wait_fraction=0.3), on_gpu)["levers"] == []
    # cache=gpu has no loader workers: more of them is no lever, whatever `workers` says
    on_gpu_default = Context(graph="whole-step", workers=8, cpu_count=16, cache="gpu")
    assert decide(evidence(loader_wait_fraction=0.3), on_gpu_default)["levers"] == []
    # images too many for cache=gpu's store: their files' bytes, decoded per batch on the GPU
    too_many = Context(graph="whole-step", workers=16, cpu_count=16, gpu_store_fits=False)
    crowded = decide(evidence(loader_wait_fraction=0.3), too_many)
    assert sets(crowded) == ["cache=encoded"]
    assert "do not fit in half the GPU's free memory" in crowded["levers"][0]["why"]
    decoding = Context(graph="whole-step", workers=8, cpu_count=16, cache="encoded")
    assert decide(evidence(loader_wait_fraction=0.3), decoding)["levers"] == []
    missing = decide(evidence(gpu_busy=0.3), Context(graphs=frozenset({"eager", "compile"})))
    assert missing["levers"][0]["needs"] == "pip install falconet-graphs-cuda"


def test_the_cpu_has_no_gpu_trace():
    cpu = Context(device="cpu", precision="fp32", workers=0, cpu_count=2)
    host_only = {"step_ms": 80.0, "loader_wait_fraction": 0.05, "gpu_busy": None}
    verdict = decide(host_only, cpu)
    assert verdict["name"] == "compute" and not verdict["gpu_trace"]
    assert "no GPU trace (device cpu)" in verdict["reason"] and verdict["levers"] == []
    waiting = decide({**host_only, "loader_wait_fraction": 0.6}, cpu)
    assert waiting["name"] == "dataloader" and sets(waiting) == ["workers=1", "cache=ram"]


def test_trials_that_disagree_are_mixed():
    assert combine(["host-launch", "host-launch"]) == "host-launch"
    assert combine(["host-launch", "compute", "host-launch"]) == "mixed"
