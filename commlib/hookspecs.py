"""The plugin contract, stated in one file.

commlib finds backends with pluggy (project name ``"commlib"``). A plugin is any
module or object that implements the hook below; it reaches commlib in one of
three ways, all ending in the same hook call:

* an entry point in the ``commlib.backends`` group (how the built-in backends
  and installed third-party packages register)::

      [project.entry-points."commlib.backends"]
      mybackend = "mypackage.commlib_plugin"

* :func:`commlib.register_backend` at run time (tests, notebooks);
* ``commlib.plugins.plugin_manager().register(module)`` for full pluggy control.

What a backend must provide is the :class:`commlib.backend.Backend` class.

A plugin may also *observe* collectives: it implements
:func:`commlib_collective_start` and/or :func:`commlib_collective_end` (with or
without backends of its own) and reaches commlib the same three ways. See
:mod:`commlib.observe` and the observability page of the docs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from commlib.backend import Backend
    from commlib.observe.event import CollectiveEvent

PROJECT = "commlib"
ENTRY_POINT_GROUP = "commlib.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def commlib_backends() -> Iterable[type[Backend] | Backend]:
    """Return the backends this plugin provides.

    Each item is a :class:`~commlib.backend.Backend` subclass (instantiated
    once, without arguments) or an instance. Names must be unique across all
    plugins.

    Examples:
        >>> from commlib import hookimpl
        >>> @hookimpl
        ... def commlib_backends():
        ...     return [MyBackend]
    """
    raise NotImplementedError  # a hookspec's body never runs: pluggy calls the plugins


@hookspec
def commlib_collective_start(event: CollectiveEvent) -> None:
    """A collective has started: it made its first call to the backend.

    Called once per user-level collective (an object collective or a ragged
    ``all_gather`` that takes several backend calls is one collective), on the
    calling thread, before it blocks. ``event`` says what it is: communicator,
    name, sequence number, group, sizes, dtypes, peers. A call refused before
    anything was sent (a ``ValueError``) is no collective and is not reported.
    Treat ``event`` as read-only; the same object comes back to
    :func:`commlib_collective_end`.

    Examples:
        >>> from commlib import hookimpl
        >>> @hookimpl
        ... def commlib_collective_start(event):
        ...     print(f"{event.name} #{event.seq} {event.nbytes} B")
    """


@hookspec
def commlib_collective_end(event: CollectiveEvent) -> None:
    """A collective has ended: ``event.duration`` and ``event.error`` are set.

    For an ``async_op=True`` collective this is when its handle's ``wait()``
    returns or raises. ``event.state`` is ``"completed"``, ``"failed"`` or
    ``"timed out"``. An observer that raises is disabled with a warning; the
    collective is not affected.

    Examples:
        >>> from commlib import hookimpl
        >>> @hookimpl
        ... def commlib_collective_end(event):
        ...     if event.error is not None:
        ...         print(f"{event.name} #{event.seq} {event.state}: {event.error}")
    """
