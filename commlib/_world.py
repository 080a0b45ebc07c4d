"""The process's commlib state, in one object: :data:`world` (as torch keeps its ``_World``).

What one process remembers between calls lives here and nowhere else: the
communicator per process group (the mmengine-style functions' cache), the
local group of :func:`commlib.init_local_group`, the world
:func:`commlib.init_dist` started and with which plugin, whether the
"launched without init_dist" warning was decided, the worlds this process
left its process id in, and what is torn down at interpreter exit.
:meth:`World.reset` puts it back as a fresh process has it (tests use it).

This module sits at the bottom of the package: it knows no other commlib
module, so every layer may ask it.
"""

from __future__ import annotations

import atexit
import gc
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from commlib import _torch_facts as torch_facts


class World:
    """commlib's state in this process; the one instance is :data:`world`.

    Examples:
        >>> world.started_plugin("gloo") is None     # init_dist has not run
        True
        >>> world.reset()                             # as a fresh process
    """

    def __init__(self) -> None:
        #: guards the communicator cache and the local group (any thread may ask)
        self.lock = threading.Lock()
        #: the communicator per process group (its key: the group, the world for ``None``)
        self.communicators: dict[Any, Any] = {}
        #: the world group the cache was filled in; another one empties it
        self.communicators_world: Any = None
        #: init_local_group's communicator, and the world group it was made in
        self.local_communicator: Any = None
        self.local_world: Any = None
        # the world init_dist started: its group's id (a reference would keep a destroyed
        # group alive past shutdown, where gloo's threads abort), its torch backend, its plugin
        self._started_world: int | None = None
        self._started_torch_backend: str | None = None
        self._started_plugin: Any = None
        #: whether the "a launcher started ranks but no init_dist" warning was decided
        self.launch_warning_decided = False
        #: worlds (their WORLD groups, held weakly) this process left its process id in
        self.worlds_recorded: weakref.WeakSet[Any] = weakref.WeakSet()
        #: worlds whose store was found unreachable (its host died), and the error that
        #: said so: asked no more, since each call on a dead store logs torch's C++
        #: warning with its stack (20 lines)
        self.stores_lost: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        #: the name of the world this process is in, among the worlds grow formed in the
        #: job's store (``w0``: the one the launcher started), and how many grows it began
        self.world_name = "w0"
        self.grows = 0
        #: (address, client) of the job's store that grow and join use, kept between calls
        self.job_store: Any = None
        #: set at interpreter exit: threads looking for a future's end stop looking
        self.exiting = threading.Event()
        # bound ``release`` methods of objects holding process groups, held weakly
        self._releases: set[weakref.WeakMethod[Callable[[], None]]] = set()
        self._forget_registered = False
        self._teardown_registered = False

    def reset(self) -> None:
        """Forget what this process learnt, as a fresh process: the cache, the started world.

        Exit teardown stays registered and the communicators still alive stay
        known to it: a process group left for C++ static teardown aborts the
        process at exit (gloo's threads), whatever a test reset.

        Examples:
            >>> world.reset()
            >>> world.communicators
            {}
        """
        self.forget_communicators()
        self._started_world = self._started_torch_backend = self._started_plugin = None
        self.launch_warning_decided = False
        self.worlds_recorded = weakref.WeakSet()
        self.stores_lost = weakref.WeakKeyDictionary()
        self.world_name, self.grows, self.job_store = "w0", 0, None

    # -- the communicator cache ----------------------------------------------------
    def forget_communicators(self) -> None:
        """Drop the cached communicators and the local group (their process groups with them).

        Examples:
            >>> world.forget_communicators()
        """
        with self.lock:
            self.communicators.clear()
            self.communicators_world = None
            self.local_communicator = self.local_world = None

    def forget_local_group(self) -> None:
        """Forget init_local_group's communicator (the cache keeps it for its group).

        Examples:
            >>> world.forget_local_group()
            >>> world.local_communicator is None
            True
        """
        with self.lock:
            self.local_communicator = self.local_world = None

    def forget_communicators_at_exit(self) -> None:
        """Drop the cache at interpreter exit (registered once, when it is first filled).

        Groups kept alive by the cache past interpreter shutdown abort the
        process from gloo's threads; they are freed while Python still runs.

        Examples:
            >>> world.forget_communicators_at_exit()
        """
        if not self._forget_registered:
            self._forget_registered = True
            atexit.register(self.forget_communicators)

    # -- the world init_dist started -----------------------------------------------
    def started(self, plugin: Any) -> None:
        """Note that ``plugin`` started the current (just initialised) world.

        Examples:
            >>> world.started(plugins.resolve_backend("gloo"))  # after init  # doctest: +SKIP
        """
        self._started_world = id(dist.group.WORLD)
        self._started_torch_backend = str(dist.get_backend())
        self._started_plugin = plugin

    def started_plugin(self, torch_backend: str) -> Any:
        """The plugin that started the current world, for a group of ``torch_backend``.

        ``None`` when init_dist did not start the current world (it was
        destroyed, or started again without it) or the group runs another
        torch backend.

        Examples:
            >>> world.started_plugin("gloo") is None     # no init_dist in this process
            True
        """
        plugin = self._started_plugin
        if plugin is None or torch_backend != self._started_torch_backend:
            return None
        if not (dist.is_initialized() and id(dist.group.WORLD) == self._started_world):
            return None
        return plugin

    # -- exit teardown -------------------------------------------------------------
    def teardown_at_exit(self, release: Callable[[], None] | None = None) -> None:
        """Destroy the process groups at exit while Python still runs (registered once).

        ``release``, a bound method, is called first if its object is still
        alive then (it is held weakly): the object lets go of its groups.

        Examples:
            >>> world.teardown_at_exit()  # doctest: +SKIP
        """
        if release is not None:
            self._releases.add(weakref.WeakMethod(release, self._releases.discard))
        if not self._teardown_registered:
            self._teardown_registered = True
            atexit.register(self._teardown)

    def _teardown(self) -> None:
        # a ProcessGroup still referenced here would be destroyed during C++ static
        # teardown, where gloo's worker threads abort the process: the user's own
        # communicators (a module-level one, say) included
        self.forget_communicators()
        for ref in list(self._releases):
            release = ref()
            if release is not None:
                release()
        if dist.is_available() and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # exiting anyway; a failed teardown must not mask the exit code
                pass
        # the uncaught error that ends the script was printed already; its traceback's
        # frames (kept as sys.last_*) would hold their engines' groups past this point
        for name in ("last_exc", "last_type", "last_value", "last_traceback"):
            if hasattr(sys, name):
                setattr(sys, name, None)
        # a group still held by garbage cycles (a caught error's traceback: its frames hold
        # the engine, the object collective's handle holds the error) would outlive this,
        # and a gloo thread that still has to drop a finished work's tensors then needs the
        # GIL of an interpreter being finalised: "terminate called without an active
        # exception". Collected here, the group's destructor joins its threads while Python runs
        gc.collect()


#: this process's commlib state
world = World()
atexit.register(world.exiting.set)


def default_store() -> Any:
    """The store of the default process group's rendezvous, or ``None`` without one.

    torch's accessor is private API: when it is missing or fails, ``None``.

    Examples:
        >>> default_store() is None     # not distributed
        True
    """
    try:
        if dist.is_available() and dist.is_initialized():
            if dist.group.WORLD in world.stores_lost:
                return None
            return torch_facts.default_store()
    except Exception:
        pass
    return None


def store_failed(exc: BaseException) -> None:
    """Note that a call on :func:`default_store` raised ``exc``; a lost connection ends its use.

    From then on :func:`default_store` is ``None`` for this world: the
    failure path (failure notes, the flight recorder's alarm, shrink) stops
    asking a store whose host died, instead of logging torch's warning on
    every look. A store that merely timed out stays in use.

    Examples:
        >>> store_failed(TimeoutError("wait timeout"))   # not a lost connection: kept
    """
    lost = getattr(dist, "DistNetworkError", ConnectionError)
    if isinstance(exc, (lost, ConnectionError)) and dist.is_available() and dist.is_initialized():
        group = dist.group.WORLD
        if group is not None:
            world.stores_lost.setdefault(group, f"{type(exc).__name__}: {exc}")
