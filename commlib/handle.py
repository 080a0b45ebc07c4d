"""``Handle`` and ``ResultHandle``: what an ``async_op=True`` collective returns."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Generator
from typing import Any, Generic, Protocol, TypeVar

import torch

from commlib import _completions as completions
from commlib._settings import as_timedelta
from commlib.types import Work


class Handle:
    """The pending result of an asynchronous collective: ``wait()`` finishes it.

    ``wait()`` also finishes commlib's own part of the call (the division of
    ``mean``, the copy back to the caller's device), so read the tensor only
    after it. It waits at most the communicator's timeout (or ``timeout``),
    then raises :class:`~commlib.errors.CommTimeoutError`.

    Examples:
        >>> comm = Communicator()
        >>> x = torch.ones(2)
        >>> h = comm.all_reduce(x, async_op=True)
        >>> h.wait()
        True
        >>> h.is_completed()
        True
    """

    def __init__(
        self,
        wait: Callable[[datetime.timedelta | None], None] | None = None,
        finish: Callable[[], None] | None = None,
        work: Work | None = None,
        *,
        value: list[torch.Tensor] | None = None,
    ):
        self._wait = wait
        self._finish = finish
        self._work = work
        self._done = False
        #: the tensors the collective writes: what its future's value is
        self.value: list[torch.Tensor] = [] if value is None else value
        self._lock = threading.Lock()  # a future's thread and the caller may both wait

    def wait(self, timeout: datetime.timedelta | float | None = None) -> bool:
        """Block until the collective is complete (at most ``timeout``); returns ``True``."""
        if self._done:
            return True
        with self._lock:
            if not self._done:
                if self._wait is not None:
                    self._wait(as_timedelta(timeout))
                if self._finish is not None:
                    self._finish()
                self._done = True
        return True

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """A ``torch.futures.Future`` completed when :meth:`wait` would return.

        Its value is the list of tensors the collective wrote (``[tensor]``
        for ``all_reduce``), as with torch's ``Work.get_future()``, so code
        that chains on it (``.then(...)``, a DDP communication hook) works;
        an error of the collective is the future's. commlib's part of the
        call (``mean``'s division, copies back) is done before it completes.
        Unless the call has completed already, the process's one watcher
        looks for its end (within the communicator's timeout, which ends the
        engine's work) and a reused pool thread completes the future, running
        its callbacks there (a callback may wait for another commlib future);
        a :meth:`wait` meanwhile keeps its own ``timeout``.

        Examples:
            >>> x = torch.ones(2)
            >>> fut = comm.all_reduce(x, async_op=True).get_future()
            >>> fut.then(lambda f: f.value()[0] * 2).wait()
            tensor([2., 2.])
        """
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()

        def complete() -> None:
            try:
                self.wait()
            except BaseException as exc:
                future.set_exception(exc)  # type: ignore[arg-type]  # torch's stub says T
            else:
                future.set_result(self.value)

        if self.is_completed():
            complete()
        else:
            # one watcher per process looks for every such call's end (never blocked inside
            # the engine, nor holding the lock a wait() needs): no thread per call
            completions.watch(self, complete)
        return future

    @property
    def work(self) -> Work | None:
        """The engine's work in flight (``None``: none was left); ``wait()`` finishes the call.

        Examples:
            >>> comm.all_reduce(torch.ones(2), async_op=True).work is None  # a world of one
            True
        """
        return self._work

    def is_completed(self) -> bool:
        """Whether the engine has finished; ``wait()`` is still needed for commlib's part.

        A call with no engine work left (a small one completed within its
        check's round, or an engine that returns none) is completed at once,
        so a ``while not h.is_completed()`` loop ends, as with torch's ``Work``.
        """
        return self._done or self._work is None or self._work.is_completed()

    def __repr__(self) -> str:
        return f"<Handle {'done' if self._done else 'pending'}>"


class _Step(Protocol):
    """What a protocol step waits on: an engine call in flight (``work`` may be ``None``)."""

    work: Work | None


T = TypeVar("T")


class ResultHandle(Generic[T]):
    """The pending result of an asynchronous object collective: ``wait()`` returns it.

    What ``async_op=True`` gives for the object collectives: the first round
    is on its way when the call returns;
    ``wait()`` finishes the rest and returns what the blocking call would
    have returned. Until then the communicator keeps the call's place: the
    next collective on its process group (through any communicator of this
    process) finishes it first, so every rank sees the same order of calls
    there; collectives on other groups do not wait for it.

    Examples:
        >>> h = comm.all_gather_object({"rank": comm.rank}, async_op=True)
        >>> h.wait()
        [{'rank': 0}]
        >>> h.is_completed()
        True
    """

    def __init__(
        self,
        steps: Generator[_Step, None, T],
        wait: Callable[[Any, datetime.timedelta | None], None],
        timeout: datetime.timedelta | None = None,
    ):
        self._steps = steps
        self._wait_step = wait
        self._timeout = timeout
        self._current: _Step | None = None
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[BaseException | None], None]] = []
        # a failure before anything is waited for (a bad argument) is raised now
        self._advance(raise_now=True)

    def _advance(self, raise_now: bool = False) -> None:
        try:
            self._current = next(self._steps)
        except StopIteration as stop:
            self._result = stop.value
            self._end(None)
        except Exception as exc:
            if raise_now:
                raise
            self._end(exc)

    def _step(self, limit: datetime.timedelta | None) -> None:
        """Wait for the round in flight, then start the next one."""
        try:
            self._wait_step(self._current, limit)
        except Exception as exc:
            self._steps.close()
            self._end(exc)
            return
        self._advance()

    def _end(self, error: BaseException | None) -> None:
        self._done, self._error, self._current = True, error, None
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(error)

    def add_done_callback(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call ``callback(error)`` when the call has finished (at once if it has).

        ``error`` is what ``wait()`` raises, or ``None``.

        Examples:
            >>> h = comm.all_gather_object("x", async_op=True)
            >>> h.add_done_callback(lambda error: print("done", error))
            done None
        """
        if self._done:
            callback(self._error)
        else:
            self._callbacks.append(callback)

    def complete(self, timeout: datetime.timedelta | float | None = None) -> None:
        """Run the call to its end (at most ``timeout`` per round); keep a failure for ``wait()``.

        Examples:
            >>> h = comm.gather_object("x", async_op=True)
            >>> h.complete()
            >>> h.is_completed()
            True
        """
        limit = as_timedelta(timeout) or self._timeout
        while not self._done:
            self._step(limit)

    def wait(self, timeout: datetime.timedelta | float | None = None) -> T:
        """Block until the call is complete (at most ``timeout`` per round); return its result.

        Raises what the blocking call would have raised.
        """
        self.complete(timeout)
        if self._error is not None:
            raise self._error
        return self._result

    def is_completed(self) -> bool:
        """Whether the call has finished; moves it on while its rounds are done (never blocks)."""
        while not self._done:
            work = self._current.work if self._current is not None else None
            if work is not None and not work.is_completed():
                return False
            self._step(self._timeout)  # the round in flight is done: this does not block
        return True

    def __repr__(self) -> str:
        return f"<ResultHandle {'done' if self._done else 'pending'}>"
