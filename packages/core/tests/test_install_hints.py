"""The install-hint catalogue: data the core ships, so that its source names no plugin."""

from __future__ import annotations

from pathlib import Path

import falconet
from falconet.install_hints import install_hints, known_provider, lever_hints


def _named_distributions() -> set[str]:
    """Every distribution the catalogue names: the registries' tables, and the verdict
    levers' (one table per verdict, ``KEY=VALUE`` to distribution)."""
    hints = install_hints()
    named = {d for kind, names in hints.items() if kind != "verdict_levers" for d in names.values()}
    return named | {
        d for verdict in hints.get("verdict_levers", {}) for d in lever_hints(verdict).values()
    }


def test_the_core_source_names_no_distribution_of_the_catalogue():
    """The catalogue is the one place the core mentions a plugin's distribution: every module of
    the core package is read for each distribution name the hints list."""
    distributions = _named_distributions()
    assert "falconet-graphs-cuda" in distributions  # the catalogue is read, not empty
    package = Path(falconet.__file__).parent
    sources = sorted(package.rglob("*.py"))
    assert len(sources) > 20
    for source in sources:
        text = source.read_text("utf-8")
        named = sorted(d for d in distributions if d in text)
        assert not named, f"{source.relative_to(package)} names {named}"


def test_each_hint_is_what_the_installed_distribution_registers(installed_falconet_plugins):
    """A hint that names an installed plugin is true: that distribution registered the name (the
    training keys are checked against the key groups in test_train_config)."""
    plugins = installed_falconet_plugins
    installed = {r.distribution for r in plugins.records if r.status == "ok"}
    checked = 0
    for kind, names in install_hints().items():
        if kind in ("train_keys", "verdict_levers"):
            continue
        registry = plugins.registries[kind]
        for name, distribution in names.items():
            if distribution in installed:
                entry = registry.entry(name)
                assert entry.provenance.distribution == distribution, (kind, name)
                checked += 1
    assert checked >= 10, "the workspace installs the first-party plugins"


def test_each_verdict_lever_hint_names_what_its_distribution_registers(
    installed_falconet_plugins,
):
    """A verdict's install hint ``graph=cuda-graph`` names the distribution that registers the
    value ``cuda-graph`` of the key ``graph``."""
    plugins = installed_falconet_plugins
    by_key = {registry.key: registry for registry in plugins.registries.values()}
    checked = 0
    for verdict in install_hints()["verdict_levers"]:
        for pair, distribution in lever_hints(verdict).items():
            key, value = pair.split("=", 1)
            assert by_key[key].entry(value).provenance.distribution == distribution, pair
            checked += 1
    assert checked >= 2


def test_a_name_the_catalogue_does_not_list_has_no_provider():
    assert known_provider("graph_backends", "cuda-graph") == "falconet-graphs-cuda"
    assert known_provider("graph_backends", "no-such-backend") is None
    assert known_provider("no_such_kind", "cuda-graph") is None
