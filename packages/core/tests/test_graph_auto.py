"""``graph=auto``, the default: the first of whole-step, cuda-graph and eager that is installed
and applies to the run, with the reasons the others did not, in one log line."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from falconet.interfaces import DispatchContext
from falconet.plugins import Plugins, get_plugins
from falconet.registry import Provenance
from falconet.training.components import choose_dispatch
from falconet.training.config import TrainConfig

TEST = Provenance("tests", "falconet-tests", "0")


@dataclass
class FakeBackend:
    """A graph backend that declines with ``reason`` (or accepts) and marks what it wraps."""

    name: str
    reason: str | None = None
    summary: str = "test backend"

    def decline_reason(self, context):
        return self.reason

    def wrap(self, network, context):
        return (self.name, network)


def _context(model: nn.Module) -> DispatchContext:
    return DispatchContext(torch.device("cpu"), "fp32", capture_region=model, options={})


def test_auto_is_the_default():
    assert TrainConfig.model_fields["graph"].default == "auto"


def test_auto_takes_the_first_backend_that_applies_and_says_why_not_the_others(caplog):
    plugins = Plugins(env={}).load_builtins()
    plugins.graph_backends.add(FakeBackend("whole-step", "the loss is not static-shaped"), TEST)
    plugins.graph_backends.add(FakeBackend("cuda-graph"), TEST)
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        name, network = choose_dispatch("auto", _context(model), model, plugins)
    assert name == "cuda-graph" and network == ("cuda-graph", model)
    (record,) = [r for r in caplog.records if "graph=auto" in r.getMessage()]
    assert record.levelno == logging.INFO  # a choice, not a problem
    assert record.getMessage() == (
        "graph=auto: cuda-graph; whole-step: the loss is not static-shaped"
    )


def test_auto_runs_eager_when_no_graph_backend_is_installed(caplog):
    plugins = Plugins(env={}).load_builtins()
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        name, network = choose_dispatch("auto", _context(model), model, plugins)
    assert name == "eager" and network is model
    assert "whole-step: not installed; cuda-graph: not installed" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_auto_on_the_cpu_with_the_cuda_backends_installed_runs_eager(caplog):
    """The installed falconet-graphs-cuda declines on the CPU, with its own reasons."""
    plugins = get_plugins()
    if "whole-step" not in plugins.graph_backends.names():  # pragma: no cover
        pytest.skip("falconet-graphs-cuda is not installed")
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        name, _ = choose_dispatch("auto", _context(model), model, plugins)
    assert name == "eager"
    assert "whole-step: CUDA graphs need a CUDA device" in caplog.text
