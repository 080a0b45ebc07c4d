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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from commlib.backend import Backend

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
