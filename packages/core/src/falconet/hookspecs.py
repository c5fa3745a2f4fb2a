"""Every hook a falconet plugin can implement, in one place.

Each hook is ``register_<kind>(register)``: the core owns the registry of that kind and passes a
``register`` callable; a plugin calls it once per item it adds. Items are cheap to create: heavy
imports (transformer_engine, hotcoco, CUDA-only code) belong inside the item's methods, never at
module level, so ``falconet plugins list`` works on any machine.

Every docstring follows one template: what the hook registers, its parameter, when it is called,
and what becomes of the return value (always ignored: the ``register`` calls are the result).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from falconet.registry import Register

PROJECT = "falconet"
"""The pluggy project name and the entry-point group plugins are found under."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_families(register: Register) -> None:
    """Register model families (:class:`falconet.contract.ModelFamily`).

    :param register: call ``register(family)`` once per family; the family's name and each of its
        model names (``yolo``, ``yolo-n``, ...) become selectable with ``model=...``.

    Called once when the plugins are loaded. The return value is ignored.
    """


@hookspec
def register_assigners(register: Register) -> None:
    """Register label assigners (:class:`falconet.contract.Assigner`).

    :param register: call ``register(assigner)`` once per assigner; its ``name`` becomes
        selectable with ``assigner=...``.

    Called once when the plugins are loaded. The return value is ignored.
    """


@hookspec
def register_eval_backends(register: Register) -> None:
    """Register COCO evaluation backends (:class:`falconet.contract.EvalBackend`).

    :param register: call ``register(backend)`` once per backend; its ``name`` becomes
        selectable with ``eval_backend=...``.

    Called once when the plugins are loaded. The return value is ignored.
    """


@hookspec
def register_precision_backends(register: Register) -> None:
    """Register numeric precision backends (:class:`falconet.contract.PrecisionBackend`).

    :param register: call ``register(backend)`` once per backend; its ``name`` becomes
        selectable with ``amp_dtype=...``.

    Called once when the plugins are loaded. The return value is ignored.
    """


@hookspec
def register_graph_backends(register: Register) -> None:
    """Register graph backends (:class:`falconet.contract.GraphBackend`): how a step runs.

    :param register: call ``register(backend)`` once per backend; its ``name`` becomes
        selectable with ``graph=...``, and its ``priority`` ranks it for ``graph=auto``.

    Called once when the plugins are loaded. The return value is ignored.
    """


@hookspec
def register_commands(register: Register) -> None:
    """Register ``falconet`` subcommands (:class:`click.Command` or :class:`click.Group`).

    :param register: call ``register(command)`` once per command; ``command.name`` is the
        subcommand (``falconet <name> ...``). A name already taken is refused with both
        distributions named.

    Called once when the plugins are loaded (before the command line is parsed).
    The return value is ignored.
    """


@hookspec
def register_callbacks(register: Register) -> None:
    """Register training callbacks (:class:`falconet.contract.CallbackFactory`).

    :param register: call ``register(factory)`` once per callback; ``factory.name`` identifies
        it in ``callbacks=...`` and in the run's log.

    Called once when the plugins are loaded. The return value is ignored.
    """


@hookspec
def register_train_keys(register: Register) -> None:
    """Register training keys of the plugin's own (:class:`falconet.keys.KeyGroup`).

    :param register: call ``register(KeyGroup(name, summary, keys))`` once per group; every
        field of the pydantic model ``keys`` becomes a training key (``falconet train
        --help`` lists it with the plugin's distribution; ``args.yaml`` saves it). A key the
        core or another plugin already declares is refused with both named.

    Called once when the plugins are loaded. The return value is ignored.
    """


@hookspec
def register_levers(register: Register) -> None:
    """Register levers (:class:`falconet.levers.Lever`): the plugin's keys that address a
    profiler verdict, and when.

    :param register: call ``register(lever)`` once per lever; the profiler asks each lever whose
        ``verdicts`` hold a run's verdict for its :class:`falconet.levers.Suggestion` and lists
        the suggestions by the levers' ``priority``. A plugin declares levers for its own keys
        only; a name another plugin already registered is refused with both named.

    Called once when the plugins are loaded. The return value is ignored.
    """
