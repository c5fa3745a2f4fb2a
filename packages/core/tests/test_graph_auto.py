"""``graph=auto``, the default: the installed backend of highest ``priority`` that applies to
the run, with the reasons the others did not, in one log line; a backend without a priority is
never chosen by ``auto``, only by name; one asked for by name that declines falls back to
``eager``."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from falconet.contract import GraphBackend, GraphContext
from falconet.graph_backends.eager import EagerBackend
from falconet.plugins import Plugins, get_plugins
from falconet.precision import FP32
from falconet.registry import Provenance
from falconet.training.backends import auto_order, choose_graph, step_replays
from falconet.training.config import ConfigError, TrainConfig

TEST = Provenance("tests", "falconet-tests", "0")


@dataclass
class FakeBackend:
    """A graph backend that declines with ``reason`` (or accepts) and marks the step it
    builds."""

    name: str
    priority: int | None = 5
    reason: str | None = None
    summary: str = "test backend"
    replays: bool = False

    def decline_reason(self, context):
        return self.reason

    def build_step(self, parts, context):
        return (self.name, parts)


def _context(model: nn.Module) -> GraphContext:
    return GraphContext(torch.device("cpu"), FP32, capture_region=model)


def _plugins(*backends: FakeBackend) -> Plugins:
    plugins = Plugins(env={}).load_builtins()
    for backend in backends:
        plugins.graph_backends.add(backend, TEST)
    return plugins


def test_auto_is_the_default():
    assert TrainConfig.model_fields["graph"].default == "auto"


def test_the_fake_is_a_graph_backend():
    assert isinstance(FakeBackend("x"), GraphBackend)


def test_auto_takes_the_first_backend_that_applies_and_says_why_not_the_others(caplog):
    whole = FakeBackend("whole-step", 20, "the loss is not static-shaped")
    graphed = FakeBackend("cuda-graph", 10)
    plugins = _plugins(whole, graphed)
    assert auto_order(plugins) == ["whole-step", "cuda-graph", "eager"]
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        name, backend = choose_graph("auto", _context(model), model, plugins)
    assert name == "cuda-graph" and backend is graphed
    assert backend.build_step("parts", _context(model)) == ("cuda-graph", "parts")
    (record,) = [r for r in caplog.records if "graph=auto" in r.getMessage()]
    assert record.levelno == logging.INFO  # a choice, not a problem
    assert record.getMessage() == (
        "graph=auto: cuda-graph; whole-step: the loss is not static-shaped"
    )


def test_auto_orders_by_priority_not_by_name_or_registration():
    plugins = _plugins(
        FakeBackend("alpha", 3),
        FakeBackend("zeta", 7),
        FakeBackend("beta", 7),
        FakeBackend("low", -1),
    )
    # highest priority first, ties by name; eager (0) is above a negative priority
    assert auto_order(plugins) == ["beta", "zeta", "alpha", "eager", "low"]
    model = nn.Linear(2, 2)
    name, _ = choose_graph("auto", _context(model), model, plugins)
    assert name == "beta"


def test_a_backend_without_priority_is_chosen_by_name_only(caplog):
    named_only = FakeBackend("example-counting", None)
    plugins = _plugins(named_only)
    assert "example-counting" not in auto_order(plugins)
    assert "compile" not in auto_order(plugins)  # the core's compile backend: by name only
    model = nn.Linear(2, 2)
    name, _ = choose_graph("auto", _context(model), model, plugins)
    assert name == "eager"
    name, backend = choose_graph("example-counting", _context(model), model, plugins)
    assert name == "example-counting" and backend is named_only


def test_auto_runs_eager_when_no_graph_backend_is_installed(caplog):
    plugins = Plugins(env={}).load_builtins()
    assert auto_order(plugins) == ["eager"]
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        name, backend = choose_graph("auto", _context(model), model, plugins)
    assert name == "eager" and isinstance(backend, EagerBackend)
    assert "graph=auto: eager" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_named_backend_that_declines_falls_back_to_eager_with_a_warning(caplog):
    plugins = _plugins(FakeBackend("fast", 5, "needs a GPU"))
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        name, backend = choose_graph("fast", _context(model), model, plugins)
    assert name == "eager" and isinstance(backend, EagerBackend)
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.getMessage() == (
        "graph=fast declined: needs a GPU; the run continues with graph=eager"
    )


def test_a_capture_region_smaller_than_the_model_is_declined(caplog):
    plugins = _plugins(FakeBackend("fast", 5))
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    context = GraphContext(torch.device("cpu"), FP32, capture_region=model[0])
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        name, _ = choose_graph("auto", context, model, plugins)
    assert name == "eager"
    assert "fast: a capture region smaller than the whole model is not supported" in caplog.text


def test_auto_with_every_backend_declining_is_an_error():
    """Only possible without the core's eager backend, which never declines."""
    plugins = Plugins(env={})
    plugins.graph_backends.add(FakeBackend("fast", 5, "needs a GPU"), TEST)
    model = nn.Linear(2, 2)
    with pytest.raises(ConfigError, match=r"every installed graph backend declined \(fast: needs"):
        choose_graph("auto", _context(model), model, plugins)


def test_the_step_replays_as_its_backend_declares():
    """What a precision backend is told (``PrecisionContext.replays``): the named backend's
    declaration, and for ``auto`` that of the first backend ``auto`` tries."""
    plugins = _plugins(FakeBackend("replaying", 50, replays=True), FakeBackend("launching", 40))
    assert step_replays("auto", plugins) and step_replays("replaying", plugins)
    assert not step_replays("launching", plugins) and not step_replays("eager", plugins)
    assert not step_replays("auto", _plugins(FakeBackend("launching", 40)))


def test_auto_on_the_cpu_with_the_cuda_backends_installed_runs_eager(caplog):
    """The installed falconet-graphs-cuda declines on the CPU, with its own reasons, in its
    priority order (whole-step before cuda-graph)."""
    plugins = get_plugins()
    if "whole-step" not in plugins.graph_backends.names():  # pragma: no cover
        pytest.skip("falconet-graphs-cuda is not installed")
    assert auto_order(plugins)[:3] == ["whole-step", "cuda-graph", "eager"]
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        name, _ = choose_graph("auto", _context(model), model, plugins)
    assert name == "eager"
    assert (
        "graph=auto: eager; whole-step: CUDA graphs need a CUDA device, and this run is on cpu; "
        "cuda-graph: CUDA graphs need a CUDA device" in caplog.text
    )
