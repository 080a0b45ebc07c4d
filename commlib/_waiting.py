"""Waiting for an engine's work while watching for a failure another rank announced.

A rank waiting on a live peer that already gave up would otherwise learn of
the failure only at its own timeout. The first rank to find a group broken
announces it in the store (:mod:`commlib._failure_notes`); a waiting rank
looks there every so often (after 50 ms, then twice as long each time, at
most every second) and stops with :class:`PeerFailed`.

Only for engines whose collectives' ``Work.wait(timeout)`` merely waits
(:attr:`commlib.Backend.interruptible_wait`): those are waited on in slices.
Point-to-point works are not (gloo ends a receive whose wait timed out), so
a waiter thread, kept for the next wait, waits on them while this one
watches; the engine's own timeout ends a wait nobody watches any more. A
point-to-point work that reports itself complete already needs neither: on
gloo a send's or receive's work never does before its ``wait()`` (so gloo's
always take the waiter), on torch's fake process group (the dispatch
benchmark) every one does.
"""

from __future__ import annotations

import datetime
import os
import queue
import threading
import time
from typing import Any

from commlib import _failure_notes
from commlib.types import Work

# when to look in the store: after the first, then twice as long each time, up to the last
_FIRST_LOOK, _LAST_LOOK = 0.05, 1.0


class PeerFailed(RuntimeError):
    """Another rank announced that the group broke while this one was waiting."""

    def __init__(self, reason: str, timed_out: bool):
        super().__init__(reason)
        self.reason = reason
        self.timed_out = timed_out


def _look(group: Any) -> None:
    earlier = _failure_notes.broken_elsewhere(group)
    if earlier is not None:
        raise PeerFailed(*earlier)


def wait_watching(work: Work, limit: datetime.timedelta, group: Any) -> None:
    """``work.wait(limit)``, or :class:`PeerFailed` as soon as another rank says ``group`` broke.

    Examples:
        >>> wait_watching(work, datetime.timedelta(seconds=30), group)  # doctest: +SKIP
    """
    if getattr(work, "interruptible", True):
        _in_slices(work, limit, group)
    elif work.is_completed():
        # nothing left to wait for (an engine whose sends complete at once): its
        # wait returns at once, raising the work's own error if it failed
        work.wait()
    else:
        _beside(work, limit, group)


_FIRST_SLICE = datetime.timedelta(seconds=_FIRST_LOOK)


def _in_slices(work: Work, limit: datetime.timedelta, group: Any) -> None:
    if limit > _FIRST_SLICE:
        # the first slice, the only one most waits need, without arithmetic
        try:
            work.wait(_FIRST_SLICE)
            return
        except RuntimeError as exc:
            if not _slice_ended(work, exc):
                return
        _look(group)
        _rest_in_slices(work, limit - _FIRST_SLICE, group, 2 * _FIRST_LOOK)
    else:
        _rest_in_slices(work, limit, group, _FIRST_LOOK)


def _slice_ended(work: Work, exc: RuntimeError) -> bool:
    """Whether ``exc`` from a sliced wait means only that the slice ran out.

    Otherwise it is the work's own failure, raised here; or the work completed
    between the wait giving up and this look (torch's ``Work`` says "Operation
    timed out" when it was not complete at that moment), and its own outcome
    counts: ``False``, or its error.
    """
    # torch's Work says this when only the wait's own time ran out
    if "Operation timed out" not in str(exc):
        raise exc
    if work.is_completed():
        work.wait()  # returns at once: raises the work's own error, if any
        return False
    return True


def _rest_in_slices(work: Work, limit: datetime.timedelta, group: Any, look: float) -> None:
    deadline = time.monotonic() + limit.total_seconds()
    while True:
        left = deadline - time.monotonic()
        try:
            work.wait(datetime.timedelta(seconds=max(min(look, left), 0.001)))
            return
        except RuntimeError as exc:
            if not _slice_ended(work, exc):
                return
            if time.monotonic() >= deadline:
                raise
        _look(group)
        look = min(2 * look, _LAST_LOOK)


class _Job:
    """One wait handed to a waiter thread, and how it ended."""

    __slots__ = ("done", "failure", "limit", "work")

    def __init__(self, work: Work, limit: datetime.timedelta):
        self.work, self.limit = work, limit
        # held until the waiter is done with the work: a bare lock, where an Event
        # (a Condition and a lock, a new lock per wait) costs microseconds a call
        self.done = threading.Lock()
        self.done.acquire()
        self.failure: BaseException | None = None


class _Waiter(threading.Thread):
    """A thread that waits on works handed to it, one at a time, for the process's life.

    Starting a thread per wait cost about a third of a small send/recv on a
    2-core machine; idle waiters are kept in :data:`_idle` instead. A waiter
    still blocked on a work whose caller gave up (another rank failed) is
    busy until the engine's own timeout ends that wait; a wait meanwhile
    takes another waiter.
    """

    def __init__(self) -> None:
        super().__init__(name="commlib-wait", daemon=True)
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                job.work.wait(job.limit)
            except BaseException as exc:  # handed to the caller's thread
                job.failure = exc
            finally:
                _idle.append(self)  # first: the caller's next wait may reuse this thread
                job.done.release()


#: waiters with nothing to wait for (list.append and pop are atomic)
_idle: list[_Waiter] = []
# a forked child has none of the parent's threads
os.register_at_fork(after_in_child=_idle.clear)


def _beside(work: Work, limit: datetime.timedelta, group: Any) -> None:
    job = _Job(work, limit)
    try:
        waiter = _idle.pop()
    except IndexError:
        waiter = _Waiter()
        waiter.start()
    waiter.jobs.put(job)
    look = _FIRST_LOOK
    while not job.done.acquire(timeout=look):
        _look(group)
        look = min(2 * look, _LAST_LOOK)
    if job.failure is not None:
        raise job.failure
