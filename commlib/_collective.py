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

Examples:
    >>> comm.all_reduce.__commlib_collective__
    'all_reduce'
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch.autograd.profiler as _profiler

from commlib import _catalog
from commlib._manager import registrations
from commlib.errors import CommError
from commlib.observe.dispatch import Refuse, current, observing

if TYPE_CHECKING:
    from commlib._engine import Engine

F = TypeVar("F", bound=Callable[..., Any])

# a communicator's engine (None for a non-member), read by the frame on every
# observed or refusing call: a C-level getter, not a Python function
engine_of: Callable[[Any], Engine | None] = operator.attrgetter("_engine")


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
