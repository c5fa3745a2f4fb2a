"""The typed registry: names, aliases, provenance, duplicates and unknown-name messages."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from falconet.contract import GraphBackend, ModelFamily
from falconet.registry import (
    DuplicateNameError,
    InvalidItemError,
    Provenance,
    Registry,
    UnknownNameError,
)

CORE = Provenance("falconet.builtin", "falconet-core", "0.1.0")
ACME = Provenance("acme", "acme-graphs", "2.0")


@dataclass
class Backend:
    name: str
    summary: str = "test backend"
    priority: int | None = None
    replays: bool = False

    def decline_reason(self, context):
        return None

    def build_step(self, parts, context):
        return None


@dataclass
class Family:
    name: str
    models: tuple[str, ...]
    summary: str = "test family"
    priority: int = 0
    built: list = field(default_factory=list)

    def build_model(self, model, num_classes): ...
    def build_loss(self, model, assigner): ...
    def default_recipe(self, model): ...
    def static_loss(self, assigner, device): ...
    def capture_region(self, model): ...
    def postprocess(self, outputs, image_sizes): ...


def graph_registry() -> Registry:
    return Registry("graph_backends", "graph backend", "graph", GraphBackend)


def test_records_provenance_and_looks_up_by_name():
    registry = graph_registry()
    registry.add(Backend("eager"), CORE)
    registry.add(Backend("cuda-graph"), ACME)
    assert registry.get("cuda-graph").name == "cuda-graph"
    assert registry.entry("eager").provenance == CORE
    assert registry.names() == ["cuda-graph", "eager"]
    assert "eager" in registry and "compile" not in registry
    assert len(registry) == 2


def test_duplicate_name_names_both_distributions():
    registry = graph_registry()
    registry.add(Backend("eager"), CORE)
    with pytest.raises(DuplicateNameError) as err:
        registry.add(Backend("eager"), ACME)
    message = str(err.value)
    assert "falconet-core 0.1.0" in message and "acme-graphs 2.0" in message
    assert "FALCONET_DISABLE_PLUGINS=acme" in message
    assert registry.entry("eager").provenance == CORE  # the first registration stands


def test_aliases_share_the_namespace():
    registry = Registry(
        "families", "model family", "model", ModelFamily, aliases=lambda f: f.models
    )
    registry.add(Family("yolo", ("yolo-n", "yolo-s")), CORE)
    assert registry.get("yolo-s").name == "yolo"
    assert registry.names() == ["yolo"]
    assert registry.names(with_aliases=True) == ["yolo", "yolo-n", "yolo-s"]
    with pytest.raises(DuplicateNameError, match="'yolo-n'"):
        registry.add(Family("yolo2", ("yolo-n",)), ACME)
    assert "yolo2" not in registry  # a refused item leaves nothing behind


def test_refuses_an_item_that_does_not_satisfy_the_interface():
    registry = graph_registry()
    with pytest.raises(InvalidItemError, match=r"acme-graphs 2\.0.*GraphBackend"):
        registry.add(object(), ACME)


@dataclass
class OldBackend:
    """A backend of the old seam: ``wrap(network, context)``, no ``build_step``, no priority."""

    name: str
    summary: str = "old backend"

    def decline_reason(self, context):
        return None

    def wrap(self, network, context):
        return network


def test_refuses_a_graph_backend_of_the_old_seam():
    with pytest.raises(InvalidItemError, match="GraphBackend"):
        graph_registry().add(OldBackend("old"), ACME)


def test_unknown_name_lists_available_and_closest_match():
    registry = graph_registry()
    registry.add(Backend("eager"), CORE)
    registry.add(Backend("compile"), CORE)
    with pytest.raises(UnknownNameError) as err:
        registry.get("compiel")
    message = str(err.value)
    assert message.startswith("graph=compiel: no graph backend named 'compiel'")
    assert "Did you mean graph=compile?" in message
    assert "Available: compile, eager." in message


def test_missing_hint_replaces_the_guess():
    registry = graph_registry()
    registry.missing_hint = lambda reg, name: f"{reg.key}={name} needs: pip install x"
    with pytest.raises(UnknownNameError, match="graph=cuda-graph needs: pip install x"):
        registry.get("cuda-graph")


def test_a_selector_names_what_the_user_wrote():
    """``profile=true`` asks for the callback ``profiler``: the message speaks of the key the
    user set, not of a ``callbacks=`` they never wrote."""
    registry = graph_registry()
    registry.missing_hint = lambda reg, name: f"{reg.key}={name} needs: pip install x"
    with pytest.raises(UnknownNameError) as info:
        registry.get("cuda-graph", selector="fast=true")
    message = str(info.value)
    assert message.startswith("fast=true: no graph backend named 'cuda-graph' is installed.")
    assert "fast=true needs: pip install x" in message and "graph=" not in message


def test_remove_plugin_forgets_names_and_aliases():
    registry = Registry(
        "families", "model family", "model", ModelFamily, aliases=lambda f: f.models
    )
    registry.add(Family("yolo", ("yolo-n",)), ACME)
    registry.add(Family("detr", ("detr-r50",)), CORE)
    registry.remove_plugin("acme")
    assert registry.names(with_aliases=True) == ["detr", "detr-r50"]
    registry.add(Family("yolo", ("yolo-n",)), CORE)  # the names are free again
