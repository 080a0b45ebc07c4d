"""From a Communicator's collective to the observer hooks and the profiler.

Every public collective of :class:`~commlib.Communicator` is wrapped by
:func:`observed`. With no observer registered and no ``torch.profiler``
running, the wrapper calls the method and does nothing else: which plugins
observe is looked up once per change of registrations, never per call. The
manager tells nobody: each change empties the slot where the lookup is kept
(``cache`` of :data:`commlib._manager.registrations`), and the wrapper
checks that slot for None.

What an observer sees is the *user-level* collective. Its engine calls (an
object collective's two rounds, a ragged ``all_gather``'s shape exchange,
strict mode's agreement) are not reported on their own, and a collective the
user called from inside another (``broadcast_object`` calls
``broadcast_object_list``) is part of the outer one. A collective starts at
its first engine call (the engine calls back through ``Engine.on_call``), so a
call refused before anything was sent is no collective, and the sequence
number is the engine's, the same on every rank.

An observer that raises is disabled with a warning (:func:`disabled`); the
collective goes on.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.autograd.profiler as _profiler
import torch.distributed as dist

from commlib import _catalog
from commlib._manager import registered_at, registrations
from commlib.errors import CommError, CommTimeoutError
from commlib.handle import Handle, ResultHandle
from commlib.observe import builtin
from commlib.observe.call_site import caller_of
from commlib.observe.call_site import sites_by_code as _sites_by_code
from commlib.observe.event import CollectiveEvent, describe, payload_facts

if TYPE_CHECKING:
    from commlib._engine import Engine


# a communicator's engine (None for a non-member), read by the frame on every
# observed or refusing call: a C-level getter, not a Python function
engine_of: Callable[[Any], Engine | None] = operator.attrgetter("_engine")


F = TypeVar("F", bound=Callable[..., Any])
#: an observer with this attribute set to True gets ``event.call_site`` filled in
CALL_SITES_ATTRIBUTE = "commlib_call_sites"
#: an observer with this attribute set to True reads every event's ``shapes``,
#: ``dtypes`` and ``nbytes`` at its start (the flight recorder does): they are made
#: there for it. For the others they are made when first read (see :class:`_Live`)
READS_PAYLOAD_ATTRIBUTE = "commlib_reads_payload"
_Call = tuple[Any, Callable[[CollectiveEvent], Any]]  # (plugin, its hook, given the event)

_lock = threading.Lock()
# id(plugin) -> (plugin, why it no longer observes, the registration it was disabled in);
# the plugin is held so that its id cannot be reused while it is here, and dropped once
# it is unregistered (registered again, it observes again)
_disabled: dict[int, tuple[Any, str, int | None]] = {}
_labels: weakref.WeakKeyDictionary[Any, tuple[str, tuple[int, ...]]] = weakref.WeakKeyDictionary()
_label_counts: dict[str, int] = {}


class _Observers:
    """The start and end hooks to call, newest-registered first, as pluggy would.

    ``call_sites``: whether one of them asked for the caller's line
    (``commlib_call_sites = True`` on the plugin); only then is the stack walked.
    ``reads_payload``: whether one of them reads every event's payload facts
    (``commlib_reads_payload = True``); only then are they made at the start.
    """

    __slots__ = (
        "any",
        "call_sites",
        "end_fn",
        "end_plugin",
        "ends",
        "reads_payload",
        "start_fn",
        "start_plugin",
        "starts",
    )

    def __init__(self, starts: list[_Call], ends: list[_Call]):
        self.starts = starts
        self.ends = ends
        # the one start (end) hook, where there is one: called without a loop
        # (most jobs run one observer, or the flight recorder alone)
        one: tuple[Any, Callable[[CollectiveEvent], Any] | None] = (None, None)
        self.start_plugin, self.start_fn = starts[0] if len(starts) == 1 else one
        self.end_plugin, self.end_fn = ends[0] if len(ends) == 1 else one
        plugins = [plugin for plugin, _ in starts + ends]
        self.call_sites = any(getattr(p, CALL_SITES_ATTRIBUTE, False) is True for p in plugins)
        self.reads_payload = any(
            getattr(p, READS_PAYLOAD_ATTRIBUTE, False) is True for p in plugins
        )
        #: whether there is anyone to tell: an attribute, read on every call (a
        #: ``__bool__`` would be a Python call each time)
        self.any = bool(starts or ends)

    def __bool__(self) -> bool:
        return self.any


def invalidate() -> None:
    """Forget which plugins observe; the next collective looks again.

    A change of registrations needs no call: the manager empties the slot itself.
    This is for a change the manager cannot see (an observer disabled here).

    Examples:
        >>> from commlib.observe import dispatch
        >>> dispatch.invalidate()
    """
    registrations.cache = None


def _calls(caller: Any) -> list[_Call]:
    out = []
    for impl in reversed(caller.get_hookimpls()):
        if getattr(impl, "hookwrapper", False) or getattr(impl, "wrapper", False):
            continue  # observers are plain hooks; a wrapper would have to wrap the call
        if id(impl.plugin) not in _disabled:
            function = impl.function
            if not impl.argnames:  # a hook that takes no event: called without it
                function = functools.partial(_without_event, function)
            out.append((impl.plugin, function))
    return out


def _without_event(function: Callable[[], Any], event: CollectiveEvent) -> Any:
    return function()


def current() -> _Observers:
    """The observers to tell, looked up again only after registrations changed.

    Examples:
        >>> from commlib.observe import dispatch
        >>> bool(dispatch.current())   # no observer installed  # doctest: +SKIP
        False
        >>> dispatch.current() is dispatch.current()   # looked up once
        True
    """
    found = registrations.cache
    if found is None:
        pm = builtin.started_manager()
        for key, (plugin, _, registration) in list(_disabled.items()):
            if not pm.is_registered(plugin) or registered_at(plugin) != registration:
                del _disabled[key]
        hook = pm.hook
        # a manager made without commlib's hookspecs has no observers, not an error
        starts = getattr(hook, "commlib_collective_start", None)
        ends = getattr(hook, "commlib_collective_end", None)
        found = _Observers(
            _calls(starts) if starts is not None else [],
            _calls(ends) if ends is not None else [],
        )
        registrations.cache = found
    return found


def disabled() -> dict[str, str]:
    """Observers switched off because a hook raised: plugin name -> why.

    Examples:
        >>> from commlib.observe import dispatch
        >>> dispatch.disabled()
        {}
    """
    current()  # forgets the ones unregistered since
    pm = builtin.started_manager()
    return {pm.get_name(plugin) or repr(plugin): why for plugin, why, _ in _disabled.values()}


def _disable(plugin: Any, exc: Exception) -> None:
    with _lock:
        if id(plugin) in _disabled:
            return
        _disabled[id(plugin)] = (plugin, f"{type(exc).__name__}: {exc}", registered_at(plugin))
    invalidate()
    warnings.warn(
        f"commlib observer {plugin!r} raised {type(exc).__name__}: {exc}; it is disabled",
        RuntimeWarning,
        stacklevel=2,
    )


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _notify(calls: list[_Call], event: CollectiveEvent) -> None:
    for plugin, function in calls:
        if id(plugin) in _disabled:
            continue
        try:
            function(event)
        except Exception as exc:  # an observer must never break a collective
            _disable(plugin, exc)


def _group_label(engine: Engine) -> tuple[str, tuple[int, ...]]:
    """The communicator's name and its members' world ranks (cached per engine)."""
    found = _labels.get(engine)
    if found is None:
        group = engine.group
        if group is None or group is dist.GroupMember.WORLD:
            name = "world"
        else:
            name = getattr(group, "group_name", None) or "group"
        if group is not None and dist.is_initialized():
            ranks = tuple(dist.get_process_group_ranks(group))
        else:
            ranks = tuple(range(engine.world_size))
        with _lock:
            count = _label_counts[name] = _label_counts.get(name, 0) + 1
        found = (name if count == 1 else f"{name}#{count}", ranks)
        _labels[engine] = found
    return found


class _Arguments:
    """Finds a method's arguments by name, without binding its signature per call."""

    def __init__(self, fn: Callable[..., Any]):
        params = list(inspect.signature(fn).parameters.values())[1:]  # after self
        self.positions = {
            p.name: i
            for i, p in enumerate(params)
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        }
        self.defaults = {p.name: None if p.default is p.empty else p.default for p in params}

    def get(self, name: str | None, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if name is None:
            return None
        if name in kwargs:
            return kwargs[name]
        pos = self.positions.get(name)
        if pos is not None and pos < len(args):
            return args[pos]
        return self.defaults.get(name)

    def finder(self, name: str | None) -> Callable[[tuple[Any, ...], Mapping[str, Any]], Any]:
        """A getter of argument ``name`` with its position and default looked up once.

        Examples:
            >>> def f(self, tensor, src=0): ...
            >>> src = _Arguments(f).finder("src")
            >>> src((None,), {}), src((None, 2), {}), src((None,), {"src": 3})
            (0, 2, 3)
        """
        if name is None:
            return lambda args, kwargs: None
        pos = self.positions.get(name, -1)
        default = self.defaults.get(name)

        def find(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
            if kwargs and name in kwargs:
                return kwargs[name]
            if 0 <= pos < len(args):
                return args[pos]
            return default

        return find


# where an engine keeps a collective's event facts (Engine.kept), before its name
_TEMPLATES = "commlib.observe.event:"
# a position no call's arguments reach: the argument was not passed positionally
_NOWHERE = sys.maxsize
_POINT_TO_POINT = _catalog.POINT_TO_POINT

# time.time() at a time.perf_counter() reading is the reading plus this offset,
# taken again each second (the wall clock may be set meanwhile): an event's start
# costs an addition, not two more clock readings
_wall_offset = time.time() - time.perf_counter()
_wall_until = 0.0


def _wall_time(t: float) -> float:
    """The wall-clock time (``time.time()``) at ``time.perf_counter()`` reading ``t``."""
    global _wall_offset, _wall_until
    now = time.perf_counter()
    _wall_offset = time.time() - now
    _wall_until = now + 1.0
    return t + _wall_offset


#: what every event of a collective on an engine shares, in the order
#: :meth:`_Live._begin` unpacks it: name, group, group ranks, rank, uniform,
#: shapes, dtypes, bytes
_Facts = tuple[str, str, tuple[int, ...], int, bool, tuple[Any, ...], tuple[str, ...], int]


def _bases(engine: Engine, collective: _Collective) -> dict[Any, Any]:
    """Where ``collective``'s events on ``engine`` start from, made once per engine.

    Under ``None``: the facts every event shares (group, ranks, name, rank,
    uniform) with no payload (under ``0``: those five alone); under a tensor
    payload's ``(shape, dtype)``: the same with that tensor's facts, made the
    first time a call passes it (bytes are elements times element size whatever
    the strides, so the two say it all).
    """
    group, ranks = _group_label(engine)
    shared: _Facts = (collective.name, group, ranks, engine.rank, collective.uniform, (), (), 0)
    found: dict[Any, Any] = {None: shared, 0: shared[:5]}
    engine.kept[collective.key] = found
    return found


def _with_facts(bases: dict[Any, Any], key: Any, tensor: torch.Tensor) -> _Facts:
    """The facts of events passing ``tensor`` (``key``: its shape and dtype), made now."""
    if len(bases) > _BASES_KEPT:  # shapes that keep changing: start again
        shared, five = bases[None], bases[0]
        bases.clear()
        bases[None], bases[0] = shared, five
    found = bases[None][:5] + payload_facts(tensor)
    bases[key] = found
    return found


_BASES_KEPT = 64

# an op's name in events by the string the caller passed ("sum", "SUM"): made once
_OP_NAMES: dict[str, str] = {}


def _event_op(op: Any) -> str | None:
    """The op's name in events: ``"sum"`` for ``"SUM"``, ``"sum"``, ``ReduceOp.SUM``.

    Examples:
        >>> _event_op("SUM"), _event_op(None)
        ('sum', None)
    """
    if op is None:
        return None
    return op.lower() if type(op) is str else str(op).lower()


def _op_name(op: str) -> str:
    name = op if op.islower() else op.lower()
    if len(_OP_NAMES) < 256:
        _OP_NAMES[op] = name
    return name


class _Collective:
    """One wrapped Communicator method: its name and where its facts are.

    ``fn`` is the method; ``guarded`` the same with argument errors handed to
    ``refuse`` (:func:`commlib._collective.refusing`), for the calls that do not go through
    :meth:`call`'s own ``try``.
    """

    # read on every observed call: slots, whatever becomes of an instance's __dict__
    __slots__ = (
        "arguments",
        "fn",
        "guarded",
        "key",
        "name",
        "op",
        "op_at",
        "op_default",
        "op_default_name",
        "payload",
        "payload_at",
        "payload_default",
        "peer",
        "peer_at",
        "peer_default",
        "refuse",
        "uniform",
    )

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        payload: str | None,
        peer: str | None,
        op: str | None,
        uniform: bool,
        guarded: Callable[..., Any] | None = None,
        refuse: Refuse | None = None,
    ):
        self.name, self.fn, self.uniform = name, fn, uniform
        self.guarded = fn if guarded is None else guarded
        self.refuse = refuse
        self.key = _TEMPLATES + name
        self.payload, self.peer, self.op = payload, peer, op
        self.arguments = _Arguments(fn)
        positions, defaults = self.arguments.positions, self.arguments.defaults
        # where each fact's argument is (by position or keyword) and its default
        self.payload_at = positions.get(payload, _NOWHERE) if payload else _NOWHERE
        self.payload_default = defaults.get(payload) if payload else None
        self.peer_at = positions.get(peer, _NOWHERE) if peer else _NOWHERE
        self.peer_default = defaults.get(peer) if peer else None
        self.op_at = positions.get(op, _NOWHERE) if op else _NOWHERE
        self.op_default = defaults.get(op) if op else None
        self.op_default_name = _event_op(self.op_default)

    def facts(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        get = self.arguments.get
        shapes, dtypes, nbytes = payload_facts(get(self.payload, args, kwargs))
        peers: dict[str, int] = {}
        if self.peer is not None:
            root = get(self.peer, args, kwargs)
            if isinstance(root, int):
                peers[self.peer] = root
        op = get(self.op, args, kwargs) if self.op is not None else None
        if op is not None:
            op = str(op).lower()
        return {
            "shapes": shapes,
            "dtypes": dtypes,
            "nbytes": nbytes,
            "peers": peers,
            "op": op,
            "async_op": bool(kwargs.get("async_op", False)),
        }

    def label(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """The ``torch.profiler`` label: ``commlib.all_reduce(sum, float32 (4,))``."""
        try:
            f = self.facts(args, kwargs)
        except Exception:  # a label is a courtesy; the name alone will do
            return f"commlib.{self.name}"
        return f"commlib.{self.name}({describe(f['peers'], f['op'], f['dtypes'], f['shapes'])})"

    def call(
        self, observers: _Observers, engine: Engine | None, comm: Any, args: Any, kwargs: Any
    ) -> Any:
        """The observed call of the method with ``args`` and ``kwargs``.

        The collectives' frames (:mod:`commlib._collective`) take it where the
        method cannot be called with its own parameters, or ``torch.profiler``
        runs; otherwise they call :meth:`enter`, the method, then :meth:`leave`
        (or :meth:`failed`) themselves, which is this without the call through
        ``*args``.
        """
        if engine is None or engine.observed is not None:
            # a non-member (the method raises), or a collective inside another
            return self.guarded(comm, *args, **kwargs)
        if not observers.any:  # the profiler alone
            with torch.profiler.record_function(self.label(args, kwargs)):
                return self.guarded(comm, *args, **kwargs)
        live = self.enter(observers, comm, args, kwargs)
        if live is None:  # (cannot be: checked above)
            return self.guarded(comm, *args, **kwargs)
        profiled = _profiler._is_profiler_enabled
        try:
            if profiled:  # the guarded method refuses, inside the label
                with torch.profiler.record_function(self.label(args, kwargs)):
                    result = self.guarded(comm, *args, **kwargs)
            else:
                result = self.fn(comm, *args, **kwargs)
        except BaseException as exc:
            self.failed(live, exc, None if profiled else kwargs)
            raise
        return self.leave(live, result)

    def enter(self, observers: _Observers, comm: Any, args: Any, kwargs: Any) -> _Live | None:
        """The event of a call about to be made (``None``: a non-member's, or a nested call).

        ``args`` and ``kwargs`` are the call's arguments, as passed to the method.
        """
        engine = engine_of(comm)
        if engine is None or engine.observed is not None:
            return None
        # the event is the span until the collective starts (the engine calls it
        # back at its first call); its slots are set here, not in an __init__ (one
        # Python call less). Where no observer reads every event, its fields are
        # made from the call's arguments when first read (_Lazy): an observer
        # that reads none (or only some events') pays for none
        live: _Live
        if observers.reads_payload:
            live = _new_live(_Recorded)
            live._payload = None  # made at the start (_fill)
        else:
            live = _new_live(_Lazy)
            live._payload, live._kwargs = args, kwargs
        live._t0 = t0 = _perf_counter()
        live._op, live._observers, live._eng = self, observers, engine
        live.communicator = comm
        live.state = ""  # not started (yet)
        live.duration = live.error = None
        if observers.call_sites:
            # from the wrapper's caller: a program's direct call is found at once,
            # its site kept by code and instruction (caller_of's first step, inline)
            f = _getframe(2)
            code = f.f_code
            known = _sites_by_code.get(id(code))
            site = None
            if known is not None and known[0] is code and known[1] is not None:
                site = known[1].get(f.f_lasti)
            live.call_site = caller_of(f) if site is None else site
        else:
            live.call_site = None
        engine.observed = live
        if not observers.reads_payload:
            if observers.any:  # (else only the profiler watches)
                # the start hooks are told at the first engine call (_Live._begin)
                engine.on_call = live._begin
        else:
            # _fill's steps for a _Recorded event, written out: this runs on every
            # call the flight recorder observes
            try:
                bases = engine.kept.get(self.key)
                if bases is None:
                    bases = _bases(engine, self)
                n = len(args)
                name = self.payload
                if name is None:
                    live._facts = bases[None]
                else:
                    if self.payload_at < n:  # (a keyword names no argument passed by position)
                        value = args[self.payload_at]
                    elif kwargs and name in kwargs:
                        value = kwargs[name]
                    else:
                        value = self.payload_default
                    if type(value) is torch.Tensor:  # the same shape and dtype, call after call
                        key = (value.shape, value.dtype)
                        facts = bases.get(key)
                        if facts is None:
                            facts = _with_facts(bases, key, value)
                        live._facts = facts
                    else:
                        live._facts = (*bases[None][:5], *payload_facts(value))
                live.start = t0 + _wall_offset if t0 < _wall_until else _wall_time(t0)
                name = self.peer
                if name is not None:
                    if self.peer_at < n:
                        root = args[self.peer_at]
                    elif kwargs and name in kwargs:
                        root = kwargs[name]
                    else:
                        root = self.peer_default
                    live.peers = {name: root} if isinstance(root, int) else {}
                else:
                    live.peers = {}
                name = self.op
                if name is None:
                    live.op = None
                elif self.op_at >= n and not (kwargs and name in kwargs):
                    live.op = self.op_default_name  # the default's name, made once
                else:
                    op = args[self.op_at] if self.op_at < n else kwargs[name]
                    if type(op) is str:
                        named = _OP_NAMES.get(op)
                        op = named if named is not None else _op_name(op)
                    elif op is not None:  # a torch ReduceOp, say
                        op = str(op).lower()
                    live.op = op
                live.async_op = bool(kwargs.get("async_op", False)) if kwargs else False
            except Exception as exc:  # observing must never break the collective
                live._facts = None
                _warn_once(f"commlib could not describe {self.name} to observers: {exc!r}")
            else:
                engine.on_call = live._begin
        live._before = engine.seq
        return live

    def failed(self, live: _Live, exc: BaseException, kwargs: Any) -> None:
        """The method raised ``exc``: the event ends with it (the caller raises it).

        An argument error before the first engine call is refused on every rank
        first (commlib._collective.refusing's steps: it joins the collective's
        first round, which starts the event); ``kwargs``: the call's keyword
        arguments (``None``: the method refused it itself).
        """
        engine = live._eng
        refuse = self.refuse
        if (
            refuse is not None
            and kwargs is not None
            and isinstance(exc, (ValueError, TypeError))
            and not isinstance(exc, CommError)
            and engine.seq == live._before
        ):
            try:
                refuse(live.communicator, engine, exc, kwargs)
            except BaseException as refused:
                engine.observed = engine.on_call = None
                live._end(refused)
                raise
        engine.observed = engine.on_call = None
        live._end(exc)

    def leave(self, live: _Live, result: Any) -> Any:
        """The method returned ``result``: the event ends (an async call's, in its wait)."""
        engine = live._eng
        observers = live._observers
        engine.observed = engine.on_call = None
        if live.state != "started":
            # nothing reached the engine (or only the profiler watches), or its
            # observers could not be told
            live._payload = live._kwargs = None  # the caller's tensors are let go
            return result
        if result is not None:
            if isinstance(result, Handle):  # an async collective ends in its wait()
                return Handle(
                    functools.partial(live._wait_on, result), None, result, value=result.value
                )
            if isinstance(result, ResultHandle):  # an async object collective ends in wait()
                result.add_done_callback(live._end)
                return result
        # live._end(None), written out: the common case
        live.duration = _perf_counter() - live._t0
        live.state = "completed"
        function = observers.end_fn
        if function is not None:
            if not (_disabled and id(observers.end_plugin) in _disabled):
                try:
                    function(live)
                except Exception as exc:  # an observer must never break a collective
                    _disable(observers.end_plugin, exc)
        else:
            for plugin, function in observers.ends:
                if _disabled and id(plugin) in _disabled:
                    continue
                try:
                    function(live)
                except Exception as exc:
                    _disable(plugin, exc)
        if live._payload is not None and _getrefcount(live) > _ALONE:
            # someone kept the event: its facts now, while the caller's tensor is
            # here, which the event then lets go (nobody kept it: it goes now)
            live._describe()
        return result

    def _fill(
        self, live: _Live, engine: Engine, t0: float, args: tuple[Any, ...], kwargs: Any
    ) -> bool:
        """Fill in a :class:`_Lazy` event's fields from its call's arguments; False if that failed.

        What every event of this collective on this engine shares (see
        _bases), then this call's. Each argument is found as :meth:`facts`
        finds it (its keyword, else its position, else its default), as
        :meth:`call` does for a :class:`_Recorded` event. The payload's facts
        are made when first read, from what was passed (``_payload``).
        """
        try:
            bases = engine.kept.get(self.key)
            if bases is None:
                bases = _bases(engine, self)
            n = len(args)
            name = self.payload
            if name is None:
                value = None
            elif kwargs and name in kwargs:
                value = kwargs[name]
            elif self.payload_at < n:
                value = args[self.payload_at]
            else:
                value = self.payload_default
            live.name, live.group, live.group_ranks, live.rank, live.uniform = bases[0]
            live._payload = _NO_PAYLOAD if value is None else value
            live.start = t0 + _wall_offset if t0 < _wall_until else _wall_time(t0)
            name = self.peer
            if name is not None:
                if self.peer_at < n:
                    root = args[self.peer_at]
                elif kwargs and name in kwargs:
                    root = kwargs[name]
                else:
                    root = self.peer_default
                live.peers = {name: root} if isinstance(root, int) else {}
            else:
                live.peers = {}
            name = self.op
            if name is None:
                live.op = None
            elif self.op_at >= n and not (kwargs and name in kwargs):
                live.op = self.op_default_name  # the default's name, made once
            else:
                op = args[self.op_at] if self.op_at < n else kwargs[name]
                if type(op) is str:
                    known = _OP_NAMES.get(op)
                    op = known if known is not None else _op_name(op)
                elif op is not None:  # a torch ReduceOp, say
                    op = str(op).lower()
                live.op = op
            live.async_op = bool(kwargs.get("async_op", False)) if kwargs else False
            return True
        except Exception as exc:  # observing must never break the collective
            live._payload = None
            _warn_once(f"commlib could not describe {self.name} to observers: {exc!r}")
            return False


class _Live(CollectiveEvent):
    """A user-level collective's event, which is also its span while it runs.

    Made by :meth:`_Collective.call` (as a :class:`_Lazy` or :class:`_Recorded`
    event, which becomes this class when its fields are made), which sets the
    span's slots, and whose ``_begin`` the engine calls at the collective's
    first engine call (``Engine.on_call``), which numbers it and tells the
    start hooks. Observers see it as the
    :class:`CollectiveEvent` it is (``dataclasses.fields`` lists the event's
    fields only); the extra slots are the dispatcher's.
    """

    # __weakref__: an observer may hold events weakly, as it could before they had slots
    __slots__ = (
        "__weakref__",
        "_before",
        "_dtypes",
        "_eng",
        "_facts",
        "_kwargs",
        "_nbytes",
        "_observers",
        "_op",
        "_payload",
        "_shapes",
        "_t0",
    )

    _op: _Collective
    _observers: _Observers
    _eng: Engine
    _t0: float
    #: the engine's sequence number before the call (an argument error before the
    #: first engine call is refused on every rank: _Collective.failed)
    _before: int
    #: a _Lazy event's call's keyword arguments (its positional ones are in _payload)
    _kwargs: Any
    #: the facts shared by the events of its collective on its engine with its
    #: payload's shape and dtype (see _bases), where made at the start (the flight
    #: recorder keeps this one tuple); unset otherwise, None once a field changed
    _facts: _Facts | None
    #: what the event's payload facts are still to be made from (None: made); a
    #: _Lazy event's: the call's positional arguments, its fields still to be made
    _payload: Any
    _shapes: tuple[tuple[int, ...], ...]
    _dtypes: tuple[str, ...]
    _nbytes: int

    # shapes, dtypes and nbytes are read through these. They are made at the
    # start when an observer reads every event's (commlib_reads_payload: the
    # flight recorder); for the others on their first read, from the payload the
    # call passed (kept in _payload until then), or as the call ends when an
    # observer kept the event unread (_Collective.call), so that the caller's
    # tensor is let go then. An event nobody kept and nobody read never makes them.
    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        if self._payload is not None:
            self._describe()
        return self._shapes

    @shapes.setter
    def shapes(self, value: tuple[tuple[int, ...], ...]) -> None:
        self._describe()  # the other facts first, from the payload
        self._payload = self._facts = None
        self._shapes = value

    @property
    def dtypes(self) -> tuple[str, ...]:
        if self._payload is not None:
            self._describe()
        return self._dtypes

    @dtypes.setter
    def dtypes(self, value: tuple[str, ...]) -> None:
        self._describe()  # the other facts first, from the payload
        self._payload = self._facts = None
        self._dtypes = value

    @property
    def nbytes(self) -> int:
        if self._payload is not None:
            self._describe()
        return self._nbytes

    @nbytes.setter
    def nbytes(self, value: int) -> None:
        self._describe()  # the other facts first, from the payload
        self._payload = self._facts = None
        self._nbytes = value

    def _describe(self) -> None:
        """The payload's facts, made now (a tensor's kept per shape and dtype); it is let go."""
        value = getattr(self, "_payload", None)  # unset in an event dataclasses.replace made
        if value is None:
            return
        self._payload = None
        if value is _NO_PAYLOAD:
            self._shapes, self._dtypes, self._nbytes = (), (), 0
        elif type(value) is torch.Tensor:
            bases = self._eng.kept.get(self._op.key)
            if bases is None:
                bases = _bases(self._eng, self._op)
            key = (value.shape, value.dtype)
            facts = bases.get(key)
            if facts is None:
                facts = _with_facts(bases, key, value)
            self._shapes, self._dtypes, self._nbytes = facts[5:]
        else:
            self._shapes, self._dtypes, self._nbytes = payload_facts(value)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # pickled and copied as the CollectiveEvent it is, without the dispatcher's slots
        return CollectiveEvent, tuple([getattr(self, name) for name in _FIELD_NAMES])

    def _begin(self, what: str) -> None:
        """The first engine call (``Engine.on_call``): the collective has started.

        Its fields were filled in by the call (:meth:`_Collective._fill`) but
        the sequence number, which is the engine's, now.
        """
        engine = self._eng
        engine.on_call = None
        if what in _POINT_TO_POINT:
            self.seq = engine.p2p_seq
            self.point_to_point = True
        else:
            self.seq = engine.seq
            self.point_to_point = False
        self.state = "started"
        # _notify, written out: it runs on every observed call (one hook: no loop)
        observers = self._observers
        function = observers.start_fn
        if function is not None:
            if not (_disabled and id(observers.start_plugin) in _disabled):
                try:
                    function(self)
                except Exception as exc:  # an observer must never break a collective
                    _disable(observers.start_plugin, exc)
            return
        for plugin, function in observers.starts:
            if _disabled and id(plugin) in _disabled:
                continue
            try:
                function(self)
            except Exception as exc:
                _disable(plugin, exc)

    def _end(self, error: BaseException | None) -> None:
        if self.state != "started":
            # not started (refused before anything was sent: not a collective), or
            # ended already (a handle waited on again after its wait failed)
            self._payload = self._kwargs = None  # the caller's tensors are let go
            return
        self._describe()  # an end out of the ordinary: the tensor is let go here
        self.duration = time.perf_counter() - self._t0
        self.error = error
        if error is None:
            self.state = "completed"
        elif isinstance(error, CommTimeoutError):
            self.state = "timed out"
        else:
            self.state = "failed"
        _notify(self._observers.ends, self)

    def _wait_on(self, handle: Handle, timeout: Any) -> None:
        """An async collective's handle: it ends when its ``wait()`` does."""
        try:
            handle.wait(timeout)
        except BaseException as exc:
            self._end(exc)
            raise
        self._end(None)


class _Lazy(_Live):
    """An event whose fields are made from its call's arguments when first read.

    What :meth:`_Collective.call` makes where no observer reads every event
    (``commlib_reads_payload``). It holds the call's arguments (``_payload``,
    ``_kwargs``) and, at the first read or write of a field made from them
    (``name``, ``group``, ``peers``, ``op``, ``start``, ...: :data:`_MADE`), it
    becomes the :class:`_Live` event it is, those fields filled in
    (:meth:`_Collective._fill`): its later reads are plain. An observer that
    reads none pays for none; an event kept past its call is made as the call
    ends, and lets the caller's tensors go.
    """

    __slots__ = ()

    def _describe(self) -> None:
        """Its fields and payload facts, made now; the call's arguments are let go."""
        self._make()
        _Live._describe(self)

    def _make(self) -> None:
        args, kwargs = self._payload, self._kwargs
        self.__class__ = _Live  # type: ignore[assignment]  # its fields are plain from now on
        self._payload = self._kwargs = None
        if args is None:  # made meanwhile (another thread read it)
            return
        c = self._op
        if not c._fill(self, self._eng, self._t0, args, kwargs):
            # what cannot fail, so that the observer reading it goes on
            self.name, self.group, self.group_ranks, self.rank = c.name, "?", (), -1
            self.uniform, self.peers, self.op, self.async_op = c.uniform, {}, None, False
            self._shapes, self._dtypes, self._nbytes = (), (), 0
            self.start = _wall_time(self._t0)


class _Recorded(_Live):
    """An event whose payload's facts were made at its start, kept in one tuple.

    What :meth:`_Collective.call` makes where an observer reads every event's
    payload (``commlib_reads_payload``: the flight recorder, which keeps the
    tuple, ``_facts``, as it is). The fields the tuple holds (:data:`_FACTS`)
    are unpacked into the event's own at the first read or write of one.
    """

    __slots__ = ()

    def _make(self) -> None:
        self.__class__ = _Live  # type: ignore[assignment]  # its fields are plain from now on
        facts = self._facts
        if facts is not None:
            (
                self.name,
                self.group,
                self.group_ranks,
                self.rank,
                self.uniform,
                self._shapes,
                self._dtypes,
                self._nbytes,
            ) = facts


def _made(name: str) -> property:
    """Field ``name`` of a :class:`_Lazy` or :class:`_Recorded` event: made when first read."""

    def get(self: _Lazy | _Recorded) -> Any:
        self._make()
        return getattr(self, name)

    def put(self: _Lazy | _Recorded, value: Any) -> None:
        self._make()
        setattr(self, name, value)

    return property(get, put, doc=f"The event's ``{name}`` (made when first read).")


#: the fields a _Recorded event unpacks from its ``_facts`` when one is first read
_FACTS = ("name", "group", "group_ranks", "rank", "uniform", "shapes", "dtypes", "nbytes")
#: the fields a _Lazy event makes from its call's arguments when one is first read
_MADE = (*_FACTS, "peers", "op", "async_op", "start")
for _name in _MADE:
    setattr(_Lazy, _name, _made(_name))
for _name in _FACTS:
    setattr(_Recorded, _name, _made(_name))
del _name


# a collective that passes no payload (barrier), for _Live._describe
_NO_PAYLOAD: Any = object()
# what observers see in a repr or a log: the class they were told of (a pickled or
# copied event is one: _Live.__reduce__)
_Live.__name__ = _Live.__qualname__ = CollectiveEvent.__qualname__
_Lazy.__name__ = _Lazy.__qualname__ = CollectiveEvent.__qualname__
_Recorded.__name__ = _Recorded.__qualname__ = CollectiveEvent.__qualname__
_new_live = _Live.__new__
_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(CollectiveEvent))
_perf_counter = time.perf_counter
_getframe = sys._getframe
_getrefcount = sys.getrefcount
# the references to an event nobody kept, as sys.getrefcount counts them in
# _Collective.leave: its caller's local, leave's argument and the function's. Python 3.14
# may lend a local without a reference, which would count a kept event as
# nobody's: there every event's facts are made at its end, whatever the count
_ALONE = 3 if sys.version_info < (3, 14) else -1


def observing(
    name: str,
    fn: Callable[..., Any],
    payload: str | None,
    peer: str | None,
    op: str | None,
    uniform: bool,
    guarded: Callable[..., Any] | None,
    refuse: Refuse | None,
) -> Any:
    """A collective's observed call: ``.call(observers, engine, comm, args, kwargs)``.

    For the frame every public collective runs in (:mod:`commlib._collective`):
    ``fn`` is the method, ``payload`` / ``peer`` / ``op`` the arguments its
    event describes, ``guarded`` the method with its argument errors handed to
    ``refuse``.
    """
    return _Collective(name, fn, payload, peer, op, uniform, guarded, refuse)


#: what :func:`observed` calls with an argument error raised before anything was sent
Refuse = Callable[[Any, "Engine", "ValueError | TypeError", Mapping[str, Any]], None]
