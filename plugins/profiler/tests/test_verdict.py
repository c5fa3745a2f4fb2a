"""The verdict rules on synthetic evidence: one case per verdict, the order of the rules, the
thresholds' edges, the levers (the core's, a test plugin's, install hints for what is missing),
the CPU case and repeated trials. Other plugins' levers are their own tests' (and the root
tests/test_levers.py's)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from falconet.install_hints import lever_hints
from falconet.levers import Suggestion, lever
from falconet.plugins import Plugins
from falconet_profiler.verdict import THRESHOLDS, Context, combine, decide


def installed(*plugins, **facts) -> Context:
    """A context whose levers are those the core's built-ins and ``plugins`` register."""
    manager = Plugins(env={}).load_builtins()
    for i, plugin in enumerate(plugins):
        record = manager.add_plugin(plugin, f"test-{i}", f"test-dist-{i}")
        assert record.status == "ok", record.failure
    return Context(
        levers=tuple(manager.levers),
        distributions=frozenset(r.distribution for r in manager.records),
        **facts,
    )


GPU = installed(
    device="cuda",
    graph="eager",
    precision="bf16",
    batch=16,
    workers=8,
    cache="none",
    cpu_count=16,
)
HINTS = list(lever_hints("host-launch"))
"""The install hints of a launch-bound run: the core's catalogue, no such plugin installed."""
HINT_DISTRIBUTIONS = list(lever_hints("host-launch").values())


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
    assert sets(verdict) == ["graph=compile", "batch=32", *HINTS]
    hint = verdict["levers"][2]
    assert hint["needs"].startswith("pip install ") and "not installed" in hint["why"]


def test_compute():
    verdict = decide(evidence(), GPU)
    assert verdict["name"] == "compute" and verdict["also"] == []
    fp32 = decide(evidence(), installed(device="cuda", precision="fp32"))
    assert sets(fp32) == ["amp_dtype=bf16"]
    low_tensor_cores = decide(evidence(tensor_core_share=0.2), GPU)
    assert sets(low_tensor_cores) == ["graph=compile"]
    with_fp16 = installed(device="cuda", precisions=frozenset({"bf16", "fp16"}))
    assert sets(decide(evidence(), with_fp16)) == ["amp_dtype=fp16"]
    in_fp16 = installed(device="cuda", precision="fp16", precisions=frozenset({"bf16", "fp16"}))
    assert sets(decide(evidence(), in_fp16)) == []


@lever("widen", "wider, for a test", ("compute", "host-launch"), 12)
def widen(context):
    """A test plugin's lever: its own key ``width``, doubled where the GPU is busy."""
    width = context.options.get("width", 1)
    return Suggestion("width", 2 * width, f"from {width}: more work per kernel")


WIDTH_PLUGIN = SimpleNamespace(register_levers=lambda register: register(widen))


def test_a_plugins_lever_joins_the_verdict_by_its_priority():
    context = installed(WIDTH_PLUGIN, device="cuda", options={"width": 3})
    compute = decide(evidence(tensor_core_share=0.2), context)
    assert sets(compute) == ["width=6", "graph=compile"]  # priority 12 above compile's 10
    assert compute["levers"][0]["why"] == "from 3: more work per kernel"
    launch = decide(evidence(gpu_busy=0.3), context)
    assert sets(launch) == ["width=6", "graph=compile", "batch=32", *HINTS]
    waiting = decide(evidence(loader_wait_fraction=0.5), context)
    assert "width=6" not in sets(waiting)  # asked only for the verdicts it declares


def test_a_suggestion_the_run_already_has_is_left_out():
    stale = lever("stale", "suggests the run's value", ("compute",), 50)(
        lambda context: Suggestion("width", 3, "already so")
    )
    plugin = SimpleNamespace(register_levers=lambda register: register(stale))
    context = installed(plugin, device="cuda", options={"width": 3})
    assert sets(decide(evidence(), context)) == []


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
    # a run whose graph backend came from the hinted distribution: no install hint
    graphed = installed(graph="whole-step", batch=64, workers=16, cpu_count=16, cache="ram")
    graphed = dataclasses.replace(graphed, distributions=frozenset(HINT_DISTRIBUTIONS))
    verdict = decide(evidence(gpu_busy=0.5, peak_reserved_fraction=0.8), graphed)
    assert verdict["levers"] == []  # the whole step graphed, memory too full to double the batch
    waiting = decide(evidence(loader_wait_fraction=0.3), graphed)
    assert sets(waiting) == ["cache=gpu"]  # every worker busy: the data moves to the GPU
    on_gpu = installed(graph="compile", workers=16, cpu_count=16, cache="gpu")
    assert decide(evidence(loader_wait_fraction=0.3), on_gpu)["levers"] == []
    # cache=gpu has no loader workers: more of them is no lever, whatever `workers` says
    on_gpu_default = installed(graph="compile", workers=8, cpu_count=16, cache="gpu")
    assert decide(evidence(loader_wait_fraction=0.3), on_gpu_default)["levers"] == []
    # images too many for cache=gpu's store: their files' bytes, decoded per batch on the GPU
    too_many = installed(graph="compile", workers=16, cpu_count=16, gpu_store_fits=False)
    crowded = decide(evidence(loader_wait_fraction=0.3), too_many)
    assert sets(crowded) == ["cache=encoded"]
    assert "do not fit in half the GPU's free memory" in crowded["levers"][0]["why"]
    decoding = installed(graph="compile", workers=8, cpu_count=16, cache="encoded")
    assert decide(evidence(loader_wait_fraction=0.3), decoding)["levers"] == []
    missing = decide(evidence(gpu_busy=0.3), installed(graphs=frozenset({"eager", "compile"})))
    assert [lever["needs"] for lever in missing["levers"] if "needs" in lever] == [
        f"pip install {d}" for d in HINT_DISTRIBUTIONS
    ]


def test_the_cpu_has_no_gpu_trace():
    cpu = installed(device="cpu", precision="fp32", workers=0, cpu_count=2)
    host_only = {"step_ms": 80.0, "loader_wait_fraction": 0.05, "gpu_busy": None}
    verdict = decide(host_only, cpu)
    assert verdict["name"] == "compute" and not verdict["gpu_trace"]
    assert "no GPU trace (device cpu)" in verdict["reason"] and verdict["levers"] == []
    waiting = decide({**host_only, "loader_wait_fraction": 0.6}, cpu)
    assert waiting["name"] == "dataloader" and sets(waiting) == ["workers=1", "cache=ram"]


def test_trials_that_disagree_are_mixed():
    assert combine(["host-launch", "host-launch"]) == "host-launch"
    assert combine(["host-launch", "compute", "host-launch"]) == "mixed"
