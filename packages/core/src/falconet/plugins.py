"""The plugin manager: finds plugins, loads them one at a time, and fills the registries.

One :class:`pluggy.PluginManager` named ``falconet`` holds the core's built-in plugins and every
entry point of group ``falconet``. The built-ins are named in :data:`DEFAULT_PLUGINS` and imported
when the manager loads them, as entry points are, so importing this module imports none of them
(they import the CLI, the trainer and the evaluation, which import this module).

Loading is isolated per plugin: a plugin that fails to import, fails validation (an unknown
hook, a bad signature) or raises inside a ``register_*`` hook is recorded with its error and
everything it registered is rolled back; the rest keep working. ``FALCONET_STRICT_PLUGINS=1``
turns such a failure into :class:`PluginLoadError`; ``FALCONET_DISABLE_PLUGINS=a,b`` skips
plugins by entry-point or distribution name.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import inspect
import os
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import click
import pluggy

from falconet import __version__, contract, hookspecs
from falconet.install_hints import known_provider
from falconet.keys import KeyGroup
from falconet.levers import Lever
from falconet.registry import Entry, Provenance, Registry

BUILTIN_PLUGIN = "falconet.builtin"
DEFAULT_PLUGINS = (BUILTIN_PLUGIN,)
"""The core's own plugins, by module name (as pytest's ``default_plugins``): each is imported
by :meth:`Plugins.load_builtins`, and registered under its module name."""
CORE_DISTRIBUTION = "falconet-core"
STRICT_ENV = "FALCONET_STRICT_PLUGINS"
DISABLE_ENV = "FALCONET_DISABLE_PLUGINS"

Status = Literal["ok", "broken", "disabled"]
Stage = Literal["import", "validate", "register"]


class PluginLoadError(RuntimeError):
    """A plugin failed to load while ``FALCONET_STRICT_PLUGINS`` is set."""


@dataclass(frozen=True)
class PluginFailure:
    """Why a plugin is broken: the stage it failed at and the exception, summarised."""

    stage: Stage
    type: str
    message: str
    traceback: str

    @property
    def summary(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type


@dataclass
class PluginRecord:
    """What ``falconet plugins list`` shows for one plugin."""

    name: str
    distribution: str
    version: str
    entry_point: str
    status: Status = "ok"
    hooks: list[str] = field(default_factory=list)
    failure: PluginFailure | None = None

    @property
    def provenance(self) -> Provenance:
        return Provenance(self.name, self.distribution, self.version)


def _registries() -> dict[str, Registry[Any]]:
    """One empty registry per hook, keyed by the hook's suffix."""
    return {
        r.kind: r
        for r in (
            Registry(
                "families",
                "model family",
                "model",
                contract.ModelFamily,
                aliases=lambda family: family.models,
            ),
            Registry("assigners", "label assigner", "assigner", contract.Assigner),
            Registry("eval_backends", "eval backend", "eval_backend", contract.EvalBackend),
            Registry(
                "precision_backends", "precision backend", "amp_dtype", contract.PrecisionBackend
            ),
            Registry("graph_backends", "graph backend", "graph", contract.GraphBackend),
            Registry("commands", "command", "command", click.Command),
            Registry("callbacks", "callback", "callbacks", contract.CallbackFactory),
            Registry("train_keys", "training-key group", "key group", KeyGroup),
            Registry("levers", "lever", "lever", Lever),
        )
    }


class _Manager(pluggy.PluginManager):
    """A pluggy manager that treats every ``register_*`` function of a plugin as a hook.

    As pytest does for ``pytest_*``: a plugin need not decorate its hooks, and a misspelled one
    (``register_familes``) becomes an unknown hook that :meth:`check_pending` reports, instead
    of a function silently never called.
    """

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("register_"):
            method = getattr(plugin, name, None)
            if inspect.isroutine(method):
                return {}
        return opts


def _env_flag(env: Mapping[str, str], key: str) -> bool:
    return env.get(key, "").strip().lower() in {"1", "true", "yes", "on"}


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-")


class Plugins:
    """The loaded plugins and their registries.

    :param env: where ``FALCONET_STRICT_PLUGINS`` and ``FALCONET_DISABLE_PLUGINS`` are read.
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.strict = _env_flag(env, STRICT_ENV)
        self.disabled = {_normalise(n) for n in env.get(DISABLE_ENV, "").split(",") if n.strip()}
        self.pm = _Manager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.registries = _registries()
        for registry in self.registries.values():
            registry.missing_hint = self._missing_hint
        self.records: list[PluginRecord] = []
        self._entry_points_loaded = False

    # -- typed access -------------------------------------------------------------------------
    @property
    def families(self) -> Registry[contract.ModelFamily]:
        return self.registries["families"]

    @property
    def assigners(self) -> Registry[contract.Assigner]:
        return self.registries["assigners"]

    @property
    def eval_backends(self) -> Registry[contract.EvalBackend]:
        return self.registries["eval_backends"]

    @property
    def precision_backends(self) -> Registry[contract.PrecisionBackend]:
        return self.registries["precision_backends"]

    @property
    def graph_backends(self) -> Registry[contract.GraphBackend]:
        return self.registries["graph_backends"]

    @property
    def commands(self) -> Registry[click.Command]:
        return self.registries["commands"]

    @property
    def callbacks(self) -> Registry[contract.CallbackFactory]:
        return self.registries["callbacks"]

    @property
    def train_keys(self) -> Registry[KeyGroup]:
        return self.registries["train_keys"]

    @property
    def levers(self) -> Registry[Lever]:
        return self.registries["levers"]

    def registered_by(self, plugin: str) -> dict[str, list[Entry[Any]]]:
        """Per kind, the entries ``plugin`` registered (kinds with none left out)."""
        found = {
            kind: [e for e in registry.entries() if e.provenance.plugin == plugin]
            for kind, registry in self.registries.items()
        }
        return {kind: entries for kind, entries in found.items() if entries}

    def broken(self) -> list[PluginRecord]:
        return [r for r in self.records if r.status == "broken"]

    # -- loading ------------------------------------------------------------------------------
    def load_builtins(self) -> Plugins:
        """Import and register the core's own plugins (:data:`DEFAULT_PLUGINS`: precision,
        graph backends, loggers, commands). Idempotent."""
        loaded = {r.name for r in self.records}
        for name in DEFAULT_PLUGINS:
            if name in loaded:
                continue
            record = self.add_plugin(
                importlib.import_module(name),
                name,
                CORE_DISTRIBUTION,
                __version__,
                entry_point="(built in)",
            )
            if record.failure:  # a bug in falconet itself: never hide it
                raise PluginLoadError(
                    f"falconet's built-in plugin {name} failed: "
                    f"{record.failure.summary}\n{record.failure.traceback}"
                )
        return self

    def load_entry_points(self) -> Plugins:
        """Load every entry point of group ``falconet``, one at a time. Idempotent."""
        if self._entry_points_loaded:
            return self
        self._entry_points_loaded = True
        seen: set[tuple[str, str]] = set()
        eps = metadata.entry_points(group=hookspecs.PROJECT)
        for ep in sorted(eps, key=lambda e: (_dist_name(e), e.name)):
            if (_dist_name(ep), ep.name) in seen:  # one distribution visible twice on sys.path
                continue
            seen.add((_dist_name(ep), ep.name))
            self._load_entry_point(ep)
        return self

    def load(self) -> Plugins:
        """Built-ins, then every installed plugin."""
        return self.load_builtins().load_entry_points()

    def _load_entry_point(self, ep: metadata.EntryPoint) -> None:
        dist, version = _dist_name(ep), (ep.dist.version if ep.dist else "?")
        record = PluginRecord(ep.name, dist, version, f"{ep.name} = {ep.value}")
        if {_normalise(ep.name), _normalise(dist)} & self.disabled:
            record.status = "disabled"
            self.records.append(record)
            return
        try:
            plugin = ep.load()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            self._fail(record, "import", exc)
            return
        self.add_plugin(plugin, ep.name, dist, version, entry_point=record.entry_point)

    def add_plugin(
        self,
        plugin: object,
        name: str,
        distribution: str,
        version: str = "0",
        *,
        entry_point: str = "",
    ) -> PluginRecord:
        """Register one plugin object (module or instance) and run its ``register_*`` hooks.

        Used for entry points, for the built-in plugin, and by tests to add temporary plugins.
        On failure the plugin is unregistered, its items rolled back and the record marked
        ``broken``; with strict mode on, :class:`PluginLoadError` is raised instead.
        """
        record = PluginRecord(name, distribution, version, entry_point or name)
        try:
            self.pm.register(plugin, name=name)
        except Exception as exc:
            self._fail(record, "validate", exc)
            return record
        record.hooks = sorted(caller.name for caller in self.pm.get_hookcallers(plugin) or [])
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self.pm.unregister(plugin)
            self._fail(record, "validate", _explain_unknown_hook(exc))
            return record
        try:
            self._run_register_hooks(plugin, record.provenance)
        except Exception as exc:
            self.pm.unregister(plugin)
            for registry in self.registries.values():
                registry.remove_plugin(name)
            self._fail(record, "register", exc)
            return record
        self.records.append(record)
        return record

    def _run_register_hooks(self, plugin: object, provenance: Provenance) -> None:
        """Call this plugin's own implementation of each ``register_*`` hook.

        The implementations are called one plugin at a time (not through ``pm.hook``) so each
        item is attributed to its distribution and one plugin's exception cannot hide another's
        registrations.
        """
        for kind, registry in self.registries.items():
            caller = getattr(self.pm.hook, f"register_{kind}")
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin:
                    impl.function(
                        *[lambda item, r=registry: r.add(item, provenance) for _ in impl.argnames]
                    )

    def _fail(self, record: PluginRecord, stage: Stage, exc: BaseException) -> None:
        record.status = "broken"
        record.failure = PluginFailure(
            stage,
            type(exc).__name__,
            str(exc).strip(),
            "".join(traceback.format_exception(exc)),
        )
        self.records.append(record)
        if self.strict:
            raise PluginLoadError(
                f"plugin {record.name!r} from {record.distribution} {record.version} failed "
                f"to {_STAGE_VERB[stage]}: {record.failure.summary}\n"
                f"(unset {STRICT_ENV} to skip broken plugins, or disable this one with "
                f"{DISABLE_ENV}={record.name})"
            ) from exc

    def why_not_loaded(self, distribution: str) -> str | None:
        """Why an installed ``distribution`` registered nothing (broken or disabled), or
        ``None`` when it loaded or is not installed."""
        for record in self.records:
            if _normalise(record.distribution) == distribution:
                if record.status == "broken" and record.failure:
                    return (
                        f"{distribution} is installed but failed to load: "
                        f"{record.failure.summary}. See `falconet plugins list`."
                    )
                if record.status == "disabled":
                    return f"{distribution} is installed but disabled by {DISABLE_ENV}."
        return None

    def _missing_hint(self, registry: Registry[Any], name: str) -> str | None:
        """Install, broken or disabled hint for a name nothing registered."""
        provider = known_provider(registry.kind, name)
        if provider and (problem := self.why_not_loaded(provider)):
            return problem
        if provider:
            return f"{registry.key}={name} needs: pip install {provider}"
        if unloaded := [r for r in self.records if r.status != "ok"]:
            names = ", ".join(f"{r.name} ({r.distribution}, {r.status})" for r in unloaded)
            return f"Plugins not loaded may provide it: {names}. See `falconet plugins list`."
        return None


_STAGE_VERB = {"import": "import", "validate": "validate", "register": "register its items"}


def _dist_name(ep: metadata.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "(unknown distribution)"


def _explain_unknown_hook(exc: pluggy.PluginValidationError) -> Exception:
    """Turn pluggy's unknown-hook error into one that names the closest real hook."""
    import difflib
    import re

    found = re.search(r"unknown hook '([^']+)'", str(exc))
    if not found:
        return exc
    known = [n for n in dir(hookspecs) if n.startswith("register_")]
    close = difflib.get_close_matches(found.group(1), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; hooks are: {', '.join(known)}"
    return pluggy.PluginValidationError(exc.plugin, f"unknown hook {found.group(1)!r}{hint}")


_loaded: Plugins | None = None


def get_plugins() -> Plugins:
    """The process-wide plugins, loaded on first use."""
    global _loaded
    if _loaded is None:
        _loaded = Plugins().load()
    return _loaded


def reset_plugins() -> None:
    """Forget the process-wide plugins (tests; a long-lived process after installing one)."""
    global _loaded
    _loaded = None
