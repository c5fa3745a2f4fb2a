"""Typed registries keyed by name, one per kind of plugin item.

A registry records which distribution registered each item, refuses a second item under a
name already taken (naming both distributions), and answers an unknown name with what is
available, the closest match and, through ``missing_hint``, how to install what was asked for.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

Register = Callable[[Any], None]
"""The callable every ``register_*`` hook receives: ``register(item)``."""


class RegistryError(Exception):
    """Base class of registry errors; the message says what is wrong and how to fix it."""


class InvalidItemError(RegistryError, TypeError):
    """A plugin registered something that does not satisfy the kind's interface."""


class DuplicateNameError(RegistryError):
    """Two plugins registered the same name."""


class UnknownNameError(RegistryError, LookupError):
    """A name was asked for that nothing installed provides."""


@dataclass(frozen=True)
class Provenance:
    """Where a registered item came from."""

    plugin: str
    """Plugin name: the entry-point name, or ``falconet.builtin`` for the core's own items."""
    distribution: str
    version: str

    def __str__(self) -> str:
        return f"{self.distribution} {self.version} (plugin {self.plugin!r})"


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered item and its provenance."""

    name: str
    item: T
    provenance: Provenance
    aliases: tuple[str, ...] = ()


@dataclass
class Registry(Generic[T]):
    """Items of one kind, keyed by name (and optional aliases, such as a family's model names).

    :param kind: the hook suffix (``families`` for ``register_families``).
    :param label: what one item is called in messages (``model family``).
    :param key: the configuration key that selects an item (``model``).
    :param interface: the class or runtime-checkable protocol every item must satisfy.
    :param aliases: extra names an item answers to; they share the namespace with names.
    :param name_of: how to read an item's name (default: its ``name`` attribute).
    """

    kind: str
    label: str
    key: str
    interface: type
    aliases: Callable[[T], Iterable[str]] | None = None
    name_of: Callable[[T], str] = lambda item: item.name
    missing_hint: Callable[[Registry[T], str], str | None] | None = None
    _entries: dict[str, Entry[T]] = field(default_factory=dict, repr=False)
    _index: dict[str, str] = field(default_factory=dict, repr=False)

    def add(self, item: T, provenance: Provenance) -> Entry[T]:
        """Register ``item``; raise :class:`InvalidItemError` or :class:`DuplicateNameError`."""
        if not isinstance(item, self.interface):
            raise InvalidItemError(
                f"{provenance} registered {item!r} as a {self.label}, but it does not satisfy "
                f"{self.interface.__module__}.{self.interface.__qualname__} "
                f"(see the register_{self.kind} hook's documentation)"
            )
        name = self.name_of(item)
        if not isinstance(name, str) or not name:
            raise InvalidItemError(f"{provenance} registered a {self.label} without a name")
        aliases = tuple(a for a in (self.aliases(item) if self.aliases else ()) if a != name)
        for claimed in (name, *aliases):
            if claimed in self._index:
                owner = self._entries[self._index[claimed]].provenance
                raise DuplicateNameError(
                    f"{self.label} {claimed!r} is registered by both {owner} and {provenance}; "
                    f"uninstall one of them or disable it with FALCONET_DISABLE_PLUGINS="
                    f"{provenance.plugin}"
                )
        if len(set(aliases)) != len(aliases):
            raise DuplicateNameError(
                f"{provenance} registered {self.label} {name!r} with repeated names {aliases}"
            )
        entry = Entry(name, item, provenance, aliases)
        self._entries[name] = entry
        for claimed in (name, *aliases):
            self._index[claimed] = name
        return entry

    def remove_plugin(self, plugin: str) -> None:
        """Forget everything ``plugin`` registered (used to roll back a plugin that failed)."""
        for name in [n for n, e in self._entries.items() if e.provenance.plugin == plugin]:
            entry = self._entries.pop(name)
            for claimed in (entry.name, *entry.aliases):
                self._index.pop(claimed, None)

    def entry(self, name: str, *, selector: str | None = None) -> Entry[T]:
        """The entry registered under ``name`` or one of its aliases.

        :param selector: what the user wrote that asked for ``name``, when it was not
            ``key=name`` (``profile=true`` asks for the callback ``profiler``); the error for a
            missing name then speaks of it.
        """
        try:
            return self._entries[self._index[name]]
        except KeyError:
            raise UnknownNameError(self._unknown_message(name, selector)) from None

    def get(self, name: str, *, selector: str | None = None) -> T:
        """The item registered under ``name`` or one of its aliases (``selector``: see
        :meth:`entry`)."""
        return self.entry(name, selector=selector).item

    def names(self, *, with_aliases: bool = False) -> list[str]:
        """Sorted names (and aliases, when asked)."""
        return sorted(self._index if with_aliases else self._entries)

    def entries(self) -> list[Entry[T]]:
        """Every entry, sorted by name."""
        return [self._entries[n] for n in sorted(self._entries)]

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __iter__(self) -> Iterator[T]:
        return (e.item for e in self.entries())

    def __len__(self) -> int:
        return len(self._entries)

    def _unknown_message(self, name: str, selector: str | None = None) -> str:
        available = self.names(with_aliases=True)
        asked = selector or f"{self.key}={name}"
        lines = [f"{asked}: no {self.label} named {name!r} is installed."]
        hint = self.missing_hint(self, name) if self.missing_hint else None
        if hint and selector:
            hint = hint.replace(f"{self.key}={name}", selector)
        if hint:
            lines.append(hint)
        close = difflib.get_close_matches(name, available, n=1)
        if close and not hint:
            lines.append(f"Did you mean {self.key}={close[0]}?")
        lines.append(f"Available: {', '.join(available) if available else '(none installed)'}.")
        return "\n".join(lines)
