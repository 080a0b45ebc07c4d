"""The frame every public collective runs in: its lane, its observers, its agreed refusal.

Each public collective of :class:`commlib.Communicator` is decorated with
:func:`collective`, which reads the collective's row in :mod:`commlib._catalog`
and wraps the method once, at import. A call then takes one of three ways:

* nothing observes and no profiler runs (the common case): the method itself,
  whose first line is its fast entry (:mod:`commlib._lanes`): a call whose lane
  is learnt is issued from there, as many frames deep as before the frame;
* an observer is registered or ``torch.profiler`` runs: the observed call
  (:mod:`commlib.observe.dispatch`), which tells the observers once per
  user-level collective;
* either way, a group-wide collective (its row has a first round) whose method
  raises a ``ValueError`` / ``TypeError`` before its first engine call refuses
  on every rank (:func:`refused_everywhere`), from a plain ``try``: nothing to
  pay per call when nothing is raised.

The wrapper is written with the method's own parameters (:func:`signature_wrapper`),
so it calls the method as an ordinary call, not through ``*args, **kwargs``; a call
that misses an argument or passes one the method lacks goes the generic way.

Examples:
    >>> comm.all_reduce.__commlib_collective__
    'all_reduce'
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch.autograd.profiler as _profiler

from commlib import _catalog
from commlib._manager import registrations
from commlib.errors import CommError
from commlib.observe.dispatch import Refuse, current, engine_of, observing

if TYPE_CHECKING:
    from commlib._engine import Engine

F = TypeVar("F", bound=Callable[..., Any])


def collective(name: str) -> Callable[[F], F]:
    """A Communicator method as public collective ``name``: its facts are its catalog row.

    Examples:
        >>> class Comm:
        ...     _engine = None
        ...     @collective("all_reduce")
        ...     def all_reduce(self, tensor, op="sum"):
        ...         return tensor
        >>> Comm().all_reduce(torch.ones(1))
        tensor([1.])
    """
    row = _catalog.ROWS[name]
    refuse = None if row.first_round is None else refused_everywhere(name)

    def decorate(fn: F) -> F:
        guarded = None if refuse is None else refusing(fn, refuse)
        observed = observing(name, fn, row.payload, row.peer, row.op, row.uniform, guarded, refuse)

        if refuse is None:

            @functools.wraps(fn)
            def wrapper(comm: Any, *args: Any, **kwargs: Any) -> Any:
                found = registrations.cache
                if found is None:
                    found = current()
                if not found.any and not _profiler._is_profiler_enabled:
                    return fn(comm, *args, **kwargs)
                return observed.call(found, engine_of(comm), comm, args, kwargs)

        else:
            refuses = refuse

            @functools.wraps(fn)
            def wrapper(comm: Any, *args: Any, **kwargs: Any) -> Any:
                found = registrations.cache
                if found is None:
                    found = current()
                if found.any or _profiler._is_profiler_enabled:
                    return observed.call(found, engine_of(comm), comm, args, kwargs)
                # refusing's steps, inline: nothing to pay until something is raised
                engine = engine_of(comm)
                if engine is None:
                    return fn(comm, *args, **kwargs)
                before = engine.seq
                try:
                    return fn(comm, *args, **kwargs)
                except (ValueError, TypeError) as exc:
                    if isinstance(exc, CommError) or engine.seq != before:
                        raise  # agreed already, or raised after the first round
                    refuses(comm, engine, exc, kwargs)
                    raise  # refuse raises; this is in case it did not

        own = signature_wrapper(fn, wrapper, observed, refuse)
        if own is not None:
            wrapper = functools.wraps(fn)(own)
        wrapper.__commlib_collective__ = name  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate


def refused_everywhere(name: str) -> Refuse:
    """What collective ``name`` does with an argument error raised before its first engine call.

    A mistake only this rank made (an op, a root out of range, a timeout it
    alone passes badly) would raise here alone while the other ranks wait in
    the collective, and this rank's next call would pair with theirs: results
    silently mixed, or a hang. So the refusal joins the collective's first
    round (:meth:`commlib._guard.Guard.refuse`), which raises on every rank.
    """

    def refuse(comm: Any, engine: Engine, exc: ValueError | TypeError, kwargs: Any) -> None:
        comm._guard.refuse(engine, name, exc, kwargs.get("timeout"))

    return refuse


def refusing(fn: Callable[..., Any], refuse: Refuse) -> Callable[..., Any]:
    """``fn``, whose argument errors before its first engine call go to ``refuse``."""

    @functools.wraps(fn)
    def call(comm: Any, *args: Any, **kwargs: Any) -> Any:
        engine = engine_of(comm)
        if engine is None:
            return fn(comm, *args, **kwargs)
        before = engine.seq
        try:
            return fn(comm, *args, **kwargs)
        except (ValueError, TypeError) as exc:
            if isinstance(exc, CommError) or engine.seq != before:
                raise
            refuse(comm, engine, exc, kwargs)
            raise

    return call


# -- the wrapper with the method's own parameters ---------------------------------------
# A wrapper taking (comm, *args, **kwargs) calls the method through *args: the
# interpreter then runs it in a C frame of its own, besides the tuple and the dicts
# (some 1.3K instructions a call, a blocking lane call's ~1.5%). The wrapper below
# is written for each method with its own parameters, so the call is an ordinary
# one; what a call does is unchanged: an argument missing, one too many or a keyword
# the method lacks goes the generic wrapper's way (the method's TypeError, refused on
# every rank alike); observers see the arguments by name as passed, positional ones
# positional.
_PLAIN_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class _Missing:
    """A parameter the caller did not pass (the method's own has no default)."""

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _as_called(
    names: tuple[str, ...], values: tuple[Any, ...], rest: tuple[Any, ...], named: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The ``(args, kwargs)`` a call passed, from the signature wrapper's parameters."""
    given = next((i for i, v in enumerate(values) if v is _MISSING), len(values))
    later = {n: v for n, v in zip(names[given:], values[given:]) if v is not _MISSING}
    return (*values[:given], *rest), {**later, **named}


_HEAD = """
def {name}(_c_comm, {positional}*_c_rest, {keywords}**_c_extra):
    if _c_rest or _c_extra{missing}:
        _c_args, _c_kwargs = _c_as_called(_c_names, ({names}), _c_rest, {{{named}**_c_extra}})
        return _c_generic(_c_comm, *_c_args, **_c_kwargs)
    _c_found = _c_registrations.cache
    if _c_found is None:
        _c_found = _c_current()
    if _c_found.any or _c_profiler._is_profiler_enabled:
        if not _c_profiler._is_profiler_enabled:  # the observed call, the method's own call
            _c_live = _c_observed.enter(_c_found, _c_comm, ({names}), {{{named}}})
            if _c_live is not None:
                try:
                    _c_result = _c_fn(_c_comm, {passed})
                except BaseException as _c_exc:
                    _c_observed.failed(_c_live, _c_exc, {{{named}}})
                    raise
                return _c_observed.leave(_c_live, _c_result)
        return _c_observed.call(_c_found, _c_engine_of(_c_comm), _c_comm, ({names}), {{{named}}})
"""
_PLAIN_TAIL = """    return _c_fn(_c_comm, {passed})
"""
_REFUSING_TAIL = """    _c_engine = _c_engine_of(_c_comm)
    if _c_engine is None:
        return _c_fn(_c_comm, {passed})
    _c_before = _c_engine.seq
    try:
        return _c_fn(_c_comm, {passed})
    except (ValueError, TypeError) as _c_exc:
        if isinstance(_c_exc, _c_CommError) or _c_engine.seq != _c_before:
            raise
        _c_refuse(_c_comm, _c_engine, _c_exc, {{{named}}})
        raise
"""


@functools.cache
def _line_here(part: str) -> int:
    """How many lines of this file come before the one where template ``part`` starts."""
    with open(__file__, encoding="utf-8") as f:
        text = f.read()
    return text.count("\n", 0, max(text.find(part), 0))


def _placed_here(source: str, tail: str) -> str:
    """``source`` (``_HEAD`` then ``tail``, formatted) with blank lines before each part,
    so that its lines are the templates' lines here: a traceback through a wrapper
    shows the line that runs. (Blank lines cost the compiler next to nothing; every
    rank process compiles the wrappers at import.)"""
    head_lines = _HEAD.count("\n")
    head_at, tail_at = _line_here(_HEAD), _line_here(tail)
    cut = 0
    for _ in range(head_lines):
        cut = source.index("\n", cut) + 1
    gap = tail_at - head_at - head_lines
    return "\n" * head_at + source[:cut] + "\n" * gap + source[cut:]


def signature_wrapper(
    fn: Callable[..., Any],
    generic: Callable[..., Any],
    observed: Any,
    refuse: Refuse | None,
) -> Callable[..., Any] | None:
    """``generic`` (the frame around method ``fn``) written with ``fn``'s own parameters.

    ``None`` where ``fn`` takes other than plain parameters (``*args``,
    ``**kwargs``, positional-only ones): ``generic`` serves it as it is.

    Examples:
        >>> def f(self, tensor, op="sum", *, timeout=None):
        ...     return tensor, op, timeout
        >>> own = signature_wrapper(f, f, None, None)
        >>> own(None, 1, timeout=2) == f(None, 1, timeout=2)  # (no observer registered)
        True
    """
    params = list(inspect.signature(fn).parameters.values())[1:]
    if any(p.kind not in _PLAIN_KINDS for p in params) or any(
        p.name.startswith("_c_") for p in params
    ):
        return None
    env: dict[str, Any] = {
        "_c_fn": fn,
        "_c_generic": generic,
        "_c_observed": observed,
        "_c_refuse": refuse,
        "_c_registrations": registrations,
        "_c_current": current,
        "_c_profiler": _profiler,
        "_c_engine_of": engine_of,
        "_c_CommError": CommError,
        "_c_as_called": _as_called,
        "_c_MISSING": _MISSING,
    }
    positional = [p for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keywords = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]

    def declared(p: inspect.Parameter) -> str:
        # every default by reference: the method's own object, or "missing"
        env[f"_c_default_{p.name}"] = _MISSING if p.default is p.empty else p.default
        return f"{p.name}=_c_default_{p.name}, "

    env["_c_names"] = tuple(p.name for p in positional)
    names = "".join(f"{p.name}, " for p in positional)
    named = "".join(f"{p.name!r}: {p.name}, " for p in keywords)
    passed = names + "".join(f"{p.name}={p.name}, " for p in keywords)
    required = [p.name for p in params if p.default is p.empty]
    tail = _PLAIN_TAIL if refuse is None else _REFUSING_TAIL
    source = (_HEAD + tail).format(
        name=fn.__name__,
        positional="".join(declared(p) for p in positional),
        keywords="".join(declared(p) for p in keywords),
        missing="".join(f" or {n} is _c_MISSING" for n in required),
        names=names,
        named=named,
        passed=passed,
    )
    # compiled as this module's code (commlib.observe.stacks knows its frames)
    exec(compile(_placed_here(source, tail), __file__, "exec"), env)
    return cast(Callable[..., Any], env[fn.__name__])
