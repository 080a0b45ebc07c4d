"""Collectives written as steps: generators that yield each engine call they wait for.

A protocol of several rounds (the object collectives) is a generator: it
starts an engine call, yields it, and continues once the call is waited for.
Run blocking, that is one round after another; run with ``async_op=True``,
the first round is issued before the call returns and the
:class:`~commlib.handle.ResultHandle` runs the rest.

The rounds of every unfinished handle come before any later collective on its
process group: each communicator call first finishes those of its group
(:func:`finish_pending`), in the order they were started, so every rank issues
the same engine calls on each group in the same order whenever its own
``wait()`` comes.
"""

from __future__ import annotations

import datetime
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, TypeVar

from commlib.handle import ResultHandle

if TYPE_CHECKING:
    from commlib._engine import Engine, Pending

T = TypeVar("T")

#: a protocol: yields the engine calls it waits for, returns its result
Steps = Generator["Pending", None, T]

#: the async object collectives whose rounds are still to run, oldest first; the list
#: itself is never replaced, so a communicator tests it for emptiness on every call
unfinished: list[tuple[Engine, ResultHandle[Any]]] = []


def call(
    engine: Engine, what: str, method: str, *args: Any, **kwargs: Any
) -> Generator[Pending, None, None]:
    """The plugin's ``method`` as a step (:meth:`Engine.start`): start, yield, resume once waited.

    Examples:
        >>> def broadcast_twice(engine, t):
        ...     yield from call(engine, "broadcast", "broadcast", t, 0)
        ...     yield from call(engine, "broadcast", "broadcast", t, 0)
        ...     return t
        >>> run(engine, broadcast_twice(engine, torch.ones(2)))
        tensor([1., 1.])
    """
    yield engine.start(what, method, *args, **kwargs)


def run(engine: Engine, steps: Steps[T], timeout: datetime.timedelta | None = None) -> T:
    """Run ``steps`` to the end, each round waiting at most ``timeout``; return the result.

    Examples:
        >>> from commlib import _objects
        >>> run(engine, _objects.all_gather_object_steps(engine, {"a": 1}, serializer, 4096))
        [{'a': 1}]
    """
    return ResultHandle(steps, engine.wait, timeout).wait()


def start(
    engine: Engine, steps: Steps[T], timeout: datetime.timedelta | None = None
) -> ResultHandle[T]:
    """Issue the first round of ``steps``; the handle runs the rest.

    Examples:
        >>> from commlib import _objects
        >>> h = start(engine, _objects.all_gather_object_steps(engine, {"a": 1}, serializer, 4096))
        >>> h.wait()
        [{'a': 1}]
    """
    handle = ResultHandle(steps, engine.wait, timeout)
    if not handle.is_completed():
        unfinished.append((engine, handle))
    return handle


def done(result: T) -> ResultHandle[T]:
    """A handle that holds ``result`` already (a world of one sends nothing).

    Examples:
        >>> done([1]).wait()
        [1]
    """
    return ResultHandle(_nothing(result), _never)


def _nothing(result: T) -> Steps[T]:
    return result
    yield  # a generator with no rounds


def _never(step: Any, timeout: datetime.timedelta | None) -> None:
    raise AssertionError("a finished handle has nothing to wait for")


def pending() -> bool:
    """Whether an async object collective's rounds are still to run (a cheap test per call).

    Examples:
        >>> pending()
        False
    """
    return bool(unfinished)


def finish_pending(group: Any) -> None:
    """Run the unfinished handles on ``group`` to their end, oldest first.

    Only ``group``'s: every rank must issue the same calls in the same order
    on each process group, not across groups, and finishing a handle of
    another group first would wait for that group's ranks, which may be
    waiting in a third group for this rank (a cycle that only the timeout
    ends).

    Examples:
        >>> finish_pending(engine.group)    # before a communicator issues anything new on it
    """
    mine = [(e, h) for e, h in unfinished if e.group is group]
    if not mine:
        return
    unfinished[:] = [(e, h) for e, h in unfinished if e.group is not group]
    for engine, handle in mine:
        # its rounds belong to the earlier call, not to the collective that drains them
        # (observers see that one start at its own first engine call)
        starting, engine.on_call = engine.on_call, None
        try:
            handle.complete()
        finally:
            engine.on_call = starting


def first_of(steps: Steps[Any], box: list[Any]) -> Steps[Any]:
    """``steps``, then ``box[0]`` as the result (a broadcast into a box of one).

    Examples:
        >>> from commlib import _objects
        >>> box = [{"lr": 0.1}]
        >>> steps = _objects.broadcast_object_list_steps(engine, box, 0, serializer, 4096)
        >>> run(engine, first_of(steps, box))
        {'lr': 0.1}
    """
    yield from steps
    return box[0]
