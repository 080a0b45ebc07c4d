"""The plugin manager: pluggy's, with commlib's hookspecs and the entry points that load.

Every entry point of the ``commlib.backends`` group is loaded and registered
when the manager starts (the first :func:`plugin_manager` call). One that
cannot be imported is remembered (:func:`load_failures`) instead of breaking
the others. The backends the plugins offer are read by :mod:`commlib.plugins`;
the observers by :mod:`commlib.observe.dispatch`.

Nobody is told when registrations change: each change bumps
:data:`registrations`'s ``generation`` and empties its ``cache`` slot, where
the observers' lookup (:mod:`commlib.observe.dispatch`) keeps what it found,
so that a collective checks one slot for None (pluggy's ``_manager`` keeps
the hook calls; this keeps only what commlib adds).
"""

from __future__ import annotations

import importlib.metadata
import threading
from typing import Any

import pluggy

from commlib import hookspecs

lock = threading.RLock()


class Registrations:
    """How the manager's registrations have changed, cheap to check.

    ``generation`` grows on every register, unregister and new manager;
    ``starts`` on every new manager; ``cache`` is a reader's value derived from
    the registrations (the observers to call), None again after every change.

    Examples:
        >>> before, pm, plugin = registrations.generation, plugin_manager(), object()
        >>> _ = pm.register(plugin)
        >>> _ = pm.unregister(plugin)
        >>> registrations.generation > before
        True
    """

    __slots__ = ("cache", "generation", "starts")

    def __init__(self) -> None:
        self.generation = 0
        self.starts = 0
        self.cache: Any = None

    def changed(self) -> None:
        """Count a change of registrations; forget what was derived from them.

        Examples:
            >>> registrations.changed()
            >>> registrations.cache is None
            True
        """
        self.generation += 1
        self.cache = None


registrations = Registrations()
_pm: pluggy.PluginManager | None = None
_entry_point_owner: dict[int, str] = {}  # id(plugin object) -> "name (dist version)"
_load_failures: dict[str, str] = {}  # entry point name -> why it did not load
_registered_at: dict[int, int] = {}  # id(plugin object) -> the generation it was registered at


def _distribution_label(ep: importlib.metadata.EntryPoint) -> str:
    dist_ = getattr(ep, "dist", None)
    if dist_ is None or dist_.metadata["name"] == "commlib":
        return ep.name
    return f"{ep.name} ({dist_.metadata['name']} {dist_.version})"


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP))


class _PluginManager(pluggy.PluginManager):
    """pluggy's manager; a change of registrations bumps :data:`registrations`."""

    def register(self, plugin: object, name: str | None = None) -> str | None:
        try:
            registered = super().register(plugin, name)
            if registered is not None:
                _registered_at[id(plugin)] = registrations.generation + 1
            return registered
        finally:
            registrations.changed()

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        try:
            gone = super().unregister(plugin, name)
            _registered_at.pop(id(gone), None)
            return gone
        finally:
            registrations.changed()


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide pluggy manager, with the entry points that load registered.

    :func:`commlib.plugins.plugin_manager` is this one with the built-in
    observers the environment asks for registered too: use that one.

    Examples:
        >>> plugin_manager().get_plugin("gloo")        # each entry point, by its name
        <module 'commlib_backends.gloo' from '...'>
    """
    global _pm
    with lock:
        if _pm is None:
            pm = _PluginManager(hookspecs.PROJECT)
            pm.add_hookspecs(hookspecs)
            for ep in _entry_points():
                if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
                    continue
                label = _distribution_label(ep)
                try:
                    plugin = ep.load()
                    pm.register(plugin, name=ep.name)
                except Exception as exc:  # one broken plugin must not break the others
                    _load_failures[ep.name] = f"{label}: {type(exc).__name__}: {exc}"
                    continue
                _entry_point_owner[id(plugin)] = label
            _pm = pm
            registrations.starts += 1
            registrations.changed()
        return _pm


def plugin_label(plugin: object) -> str | None:
    """How ``commlib info`` names ``plugin``: its entry point and distribution, else its name.

    Examples:
        >>> import commlib_backends.gloo
        >>> plugin_label(commlib_backends.gloo)
        'gloo'
    """
    pm = plugin_manager()
    return _entry_point_owner.get(id(plugin)) or pm.get_name(plugin)


def load_failures() -> dict[str, str]:
    """The entry points that did not load: name -> why (``"name (dist version): Error: ..."``).

    Examples:
        >>> load_failures()             # every installed plugin loads  # doctest: +SKIP
        {}
    """
    plugin_manager()
    return dict(_load_failures)


def registered_at(plugin: object) -> int | None:
    """The :data:`registrations` generation ``plugin`` was registered at; None if it is not.

    A plugin unregistered and registered again has a new one.

    Examples:
        >>> registered_at(object()) is None
        True
    """
    return _registered_at.get(id(plugin))


def restart(pm: pluggy.PluginManager | None = None) -> None:
    """Start afresh: the next :func:`plugin_manager` loads the entry points again (or is ``pm``).

    For tests that need a process's first start; registrations made since are gone.

    Examples:
        >>> restart()   # doctest: +SKIP
    """
    global _pm
    with lock:
        _pm = pm
        _load_failures.clear()
        _entry_point_owner.clear()
        _registered_at.clear()
        if pm is not None:
            registrations.starts += 1
        registrations.changed()
