"""Levers: the training keys a plugin suggests for a profiler verdict, registered through
``register_levers``.

A verdict (``dataloader``, ``host-launch``, ``compute``, ``memory-pressure``: docs/profiling.md)
says which resource limits a run's step; a lever says which key addresses it, when and why. Each
plugin declares the levers of its own keys, so the profiler lists what is installed and names no
plugin: with a plugin uninstalled, its levers are gone from the verdicts. The core's own keys
(``workers``, ``cache``, ``batch``, ``amp_dtype``, ``graph=compile``) are levers of the core's
built-in plugin (:mod:`falconet.builtin_levers`).

Importing this module costs nothing: a lever is plain data and a function of the run's facts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from pydantic import BaseModel

    KeysT = TypeVar("KeysT", bound=BaseModel)

VERDICTS = ("dataloader", "host-launch", "compute", "memory-pressure")
"""The verdicts a lever may address (the profiler's ``mixed`` combines trials and has none)."""


@dataclass(frozen=True)
class Suggestion:
    """What a lever suggests for one run: set ``key`` to ``value``, because ``why``.

    ``why`` says what the value does and why it helps this run, in a clause or two (the
    report prints ``key=value (why)``); ``needs`` is what the user must install or do first,
    where the value cannot run as the run is installed.
    """

    key: str
    value: Any
    why: str
    needs: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The verdict's form of the suggestion: ``{key, value, set, why[, needs]}``."""
        out = {"key": self.key, "value": self.value, "set": f"{self.key}={self.value}"}
        out["why"] = self.why
        if self.needs:
            out["needs"] = self.needs
        return out


@dataclass(frozen=True)
class LeverContext:
    """What a lever decides by: the verdict, its evidence and the run's facts.

    ``evidence`` holds the figures of docs/profiling.md (``step_ms``, ``gpu_busy``,
    ``tensor_core_share``, ...; a GPU figure is ``None`` where it was not measured).
    ``device`` is the device type (``cuda``, ``cpu``); ``graph`` and ``precision`` the names of
    the run's graph and precision backends; ``batch``, ``workers`` and ``cache`` the core's keys;
    ``gpu_store_fits`` whether the training images would fit ``cache=gpu``'s store (``None``:
    not known); ``options`` every key of the run, plugins' keys included, which a lever reads
    back typed with :meth:`keys`; ``graph_backends`` and ``precision_backends`` the names
    installed.
    """

    verdict: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    device: str = "cuda"
    graph: str = "eager"
    precision: str = "bf16"
    batch: int = 16
    workers: int = 8
    cache: str = "none"
    gpu_store_fits: bool | None = None
    cpu_count: int = 8
    options: Mapping[str, Any] = field(default_factory=dict)
    graph_backends: frozenset[str] = frozenset({"eager", "compile"})
    precision_backends: frozenset[str] = frozenset({"fp32", "bf16"})

    def keys(self, model: type[KeysT]) -> KeysT:
        """The run's values of the keys ``model`` declares (a plugin's
        :class:`falconet.keys.KeyGroup` model), validated; defaults where the run has none."""
        from falconet.contract import validated_keys

        return validated_keys(self.options, model)


@runtime_checkable
class Lever(Protocol):
    """What ``register_levers`` registers: one key a plugin suggests, and when.

    ``name`` identifies the lever in ``falconet plugins list`` (``cuda-graph``, ``batch-up``);
    ``summary`` is its one line there. ``verdicts`` are the verdicts it addresses (of
    :data:`VERDICTS`); the profiler asks it only for those. ``priority`` orders a verdict's
    levers, highest first (the core's run from -10 to 20: docs/plugins.md lists them).

    ``suggest(context)`` returns the :class:`Suggestion` for this run, or ``None`` where the
    lever does not apply to it: the run already has the value, the device cannot use it, or
    another lever comes first. It reads no device value and never raises for a run it cannot
    help.
    """

    name: str
    summary: str
    verdicts: tuple[str, ...]
    priority: int

    def suggest(self, context: LeverContext) -> Suggestion | None: ...


Rule = Callable[[LeverContext], "Suggestion | None"]
"""A lever's decision: the suggestion for this run, or ``None``."""


@dataclass(frozen=True)
class FunctionLever:
    """A lever made of a function: ``suggest`` is ``rule(context)``. Most levers are one."""

    name: str
    summary: str
    verdicts: tuple[str, ...]
    priority: int
    rule: Rule = field(repr=False)

    def suggest(self, context: LeverContext) -> Suggestion | None:
        return self.rule(context)


def lever(
    name: str, summary: str, verdicts: tuple[str, ...], priority: int
) -> Callable[[Rule], FunctionLever]:
    """Make a rule function a lever: ``@lever("cuda-graph", "...", ("host-launch",), 30)``."""

    def make(rule: Rule) -> FunctionLever:
        return FunctionLever(name, summary, verdicts, priority, rule)

    return make
