"""Every hook, end to end: a plugin implementing it fills the matching registry, and an item that
does not satisfy the kind's interface breaks that plugin with the interface named."""

from __future__ import annotations

from types import SimpleNamespace

import click
import pytest
from pydantic import BaseModel, Field

from falconet import hookspecs
from falconet.graph_backends.eager import EagerBackend
from falconet.keys import KeyGroup
from falconet.levers import Suggestion, lever
from falconet.precision import AutocastPrecision


class Family:
    name, summary, models, priority = "toy", "toy family", ("toy-s", "toy-m"), 0

    def build_model(self, model, num_classes): ...
    def build_loss(self, model, assigner): ...
    def default_recipe(self, model): ...
    def static_loss(self, assigner, device): ...
    def capture_region(self, model): ...
    def postprocess(self, outputs, image_sizes): ...


class Assigner:
    name, summary = "nearest", "nearest centre"

    def __call__(self, pred_scores, pred_boxes, anchor_points, gt_boxes, gt_labels, gt_counts): ...
    def static_on(self, device): ...


class EvalBackend:
    name, summary, priority = "toy-eval", "toy evaluator", -1

    def version(self):
        return "1"

    def evaluate(self, ground_truth, detections):
        return {}


class Callback:
    name, summary = "toy-logger", "logs nothing"

    def wanted(self, config):
        return False

    def __call__(self, **options):
        return self


class ToyKeys(BaseModel):
    toy_depth: int = Field(2, description="how deep the toy goes")


@click.command("toy")
def toy_command():
    """A toy command."""


class Graph(EagerBackend):
    name, priority = "toy-graph", None


@lever("toy-lever", "a toy's key", ("compute",), 0)
def toy_lever(context):
    return Suggestion("toy_depth", 3, "deeper")


VALID = {
    "families": (Family(), "toy-m"),
    "assigners": (Assigner(), "nearest"),
    "eval_backends": (EvalBackend(), "toy-eval"),
    "precision_backends": (AutocastPrecision("toy-fp32", "plain"), "toy-fp32"),
    "graph_backends": (Graph(), "toy-graph"),
    "commands": (toy_command, "toy"),
    "callbacks": (Callback(), "toy-logger"),
    "train_keys": (KeyGroup("toy-keys", "the toy's keys", ToyKeys), "toy-keys"),
    "levers": (toy_lever, "toy-lever"),
}


def test_every_hook_is_covered_here():
    hooks = {n.removeprefix("register_") for n in dir(hookspecs) if n.startswith("register_")}
    assert hooks == set(VALID)


@pytest.mark.parametrize("kind", sorted(VALID))
def test_hook_fills_its_registry(kind, falconet_plugins, add_falconet_plugin):
    item, lookup = VALID[kind]
    plugin = SimpleNamespace(**{f"register_{kind}": lambda register: register(item)})
    record = add_falconet_plugin(plugin, name="toy", distribution="toy-dist")
    assert record.status == "ok", record.failure
    assert record.hooks == [f"register_{kind}"]
    registry = falconet_plugins.registries[kind]
    assert registry.get(lookup) is item
    assert registry.entry(lookup).provenance.distribution == "toy-dist"


@pytest.mark.parametrize("kind", sorted(VALID))
def test_hook_refuses_an_item_of_the_wrong_kind(kind, add_falconet_plugin):
    plugin = SimpleNamespace(**{f"register_{kind}": lambda register: register("not an item")})
    record = add_falconet_plugin(plugin, distribution="toy-dist")
    assert record.status == "broken"
    assert record.failure.type == "InvalidItemError"
    assert "toy-dist" in record.failure.message and "does not satisfy" in record.failure.message


class NoWanted:
    """A callback factory of the old seam: no ``wanted(config)``."""

    name, summary = "old-logger", "logs nothing"

    def __call__(self, **options):
        return self


class NoPriority:
    """An eval backend of the old seam: no ``priority`` for ``eval_backend=auto``."""

    name, summary = "old-eval", "toy evaluator"

    def version(self):
        return "1"

    def evaluate(self, ground_truth, detections, *, threads=None):
        return {}


@pytest.mark.parametrize(
    ("kind", "item", "interface"),
    [
        ("callbacks", NoWanted(), "CallbackFactory"),
        ("eval_backends", NoPriority(), "EvalBackend"),
    ],
)
def test_hook_refuses_an_item_missing_what_auto_needs(kind, item, interface, add_falconet_plugin):
    plugin = SimpleNamespace(**{f"register_{kind}": lambda register: register(item)})
    record = add_falconet_plugin(plugin, distribution="toy-dist")
    assert record.status == "broken"
    assert record.failure.type == "InvalidItemError"
    assert interface in record.failure.message
