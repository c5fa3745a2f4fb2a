"""The profiler's levers come from the plugins that own the keys (``register_levers``): with the
shipped plugins the verdicts say what they said when the profiler knew them, without
falconet-graphs-cuda its levers are gone, and a third party's lever reaches a real run's
profile.json."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import falconet_graphs_cuda
import falconet_precision_te_fp8
from falconet.levers import Suggestion, lever
from falconet.plugins import Plugins
from falconet.training.planning import plan_run
from falconet.training.trainer import Trainer
from falconet_profiler.callback import Profiler
from falconet_profiler.verdict import Context, decide

SHIPPED = {
    "falconet-graphs-cuda": falconet_graphs_cuda,
    "falconet-precision-te-fp8": falconet_precision_te_fp8,
}


def context(without: tuple[str, ...] = (), **facts) -> Context:
    """The built-ins and the shipped lever plugins, less ``without``, as the trainer hands
    them to the profiler (:class:`falconet.training.run_state.Installed`)."""
    plugins = Plugins(env={}).load_builtins()
    for distribution, module in SHIPPED.items():
        if distribution not in without:
            plugins.add_plugin(module, distribution.removeprefix("falconet-"), distribution)
    installed = {
        "levers": tuple(plugins.levers),
        "distributions": frozenset(r.distribution for r in plugins.records if r.status == "ok"),
        "graphs": frozenset(plugins.graph_backends.names()),
        "precisions": frozenset(plugins.precision_backends.names()),
    }
    return Context(**{**installed, **facts})


def evidence(**changes):
    base = {"step_ms": 50.0, "loader_wait_fraction": 0.02, "gpu_busy": 0.9}
    base |= {"peak_reserved_fraction": 0.4, "tensor_core_share": 0.7}
    return {**base, **changes}


def sets(verdict):
    return [lever["set"] for lever in verdict["levers"]]


def test_a_launch_bound_step_gets_the_graphs_first():
    verdict = decide(evidence(gpu_busy=0.2), context())
    assert sets(verdict) == ["graph=cuda-graph", "graph=whole-step", "graph=compile", "batch=32"]
    assert not any("needs" in lever for lever in verdict["levers"])
    assert "one launch per graph" in verdict["levers"][0]["why"]
    network_only = decide(evidence(gpu_busy=0.5), context(graph="cuda-graph"))
    assert sets(network_only)[0] == "graph=whole-step"  # next: the loss and optimizer too


def test_a_busy_gpu_gets_precision_then_the_fused_step_then_fp8():
    whole_step = context(graph="whole-step")
    assert sets(decide(evidence(), whole_step)) == [
        "amp_dtype=fp16",
        "bn_silu=triton",
        "fuse=inductor-loss",
        "amp_dtype=fp8",
    ]
    fused = context(graph="whole-step", options={"fuse": "inductor-loss", "bn_silu": "triton"})
    assert "bn_silu=triton" not in sets(decide(evidence(), fused))
    fp32 = context(precision="fp32")
    assert sets(decide(evidence(), fp32)) == ["amp_dtype=bf16"]  # half precision first


def test_without_graphs_cuda_its_levers_are_gone():
    without = ("falconet-graphs-cuda",)
    launch = decide(evidence(gpu_busy=0.2), context(without))
    installed = [lever for lever in launch["levers"] if "needs" not in lever]
    assert [lever["set"] for lever in installed] == ["graph=compile", "batch=32"]
    # what is left of it is the core's install hint: the key=value and the command, no claim
    hints = [lever for lever in launch["levers"] if "needs" in lever]
    assert [lever["set"] for lever in hints] == ["graph=cuda-graph", "graph=whole-step"]
    assert {lever["needs"] for lever in hints} == {"pip install falconet-graphs-cuda"}
    assert not any("one launch per graph" in lever["why"] for lever in hints)
    busy = decide(evidence(), context(without, graph="whole-step"))
    assert not {"bn_silu", "fuse"} & {lever["key"] for lever in busy["levers"]}
    no_fp8 = decide(evidence(), context(("falconet-precision-te-fp8",)))
    assert "amp_dtype=fp8" not in sets(no_fp8)


@lever("threads", "more intra-op threads, for a test", ("compute",), 0)
def more_threads(context):
    if context.device != "cpu":
        return None
    return Suggestion("threads", 4, "the host computes the step: more threads share it")


def test_a_third_partys_lever_reaches_a_real_runs_verdict(tiny_run, installed_falconet_plugins):
    plugins = installed_falconet_plugins
    record = plugins.add_plugin(
        SimpleNamespace(register_levers=lambda register: register(more_threads)),
        "threads-plugin",
        "test-threads",
    )
    assert record.status == "ok", record.failure
    keys = {**tiny_run, "val": "false", "nbs": "16", "epochs": 2, "profile": "true"}
    plan = plan_run({**keys, "profile_warmup": 0, "profile_steps": 2}, plugins)
    summary = Trainer(plan, plugins, [Profiler()]).fit()
    doc = json.loads((Path(summary["run_dir"]) / "profile.json").read_text())
    assert doc["verdict"]["name"] == "compute"  # the CPU, its loader not waited for
    assert "threads=4" in sets(doc["verdict"])
