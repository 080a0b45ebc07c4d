"""Waiting for an engine's work while watching for a failure another rank announced.

A rank waiting on a live peer that already gave up would otherwise learn of
the failure only at its own timeout. The first rank to find a group broken
announces it in the store (:mod:`commlib._failure_notes`); a waiting rank
looks there every so often (after 50 ms, then twice as long each time, at
most every second) and stops with :class:`PeerFailed`. Three ways, by what
the engine's ``Work.wait(timeout)`` does when its time runs out:

* it only waits (:attr:`commlib.Backend.interruptible_wait`: the collectives
  of gloo and MPI, MPI's point-to-point too): the wait is taken in slices in
  the caller's thread, with a look at the store in between;
* it ends every operation pending on the group
  (:attr:`commlib.Backend.p2p_timeout_ends_group`: gloo's sends and receives,
  whose timed-out wait closes the group's connections, "Application timeout
  caused pair closure"): such a wait cannot be sliced, so the caller waits
  on the work in its own thread, once, and one watcher thread per process
  does the looks for every such wait in progress. When it finds the group
  announced broken, it ends the wait the way the engine allows: a wait of a
  millisecond of its own on the same work times out, which ends the caller's
  wait with an error at once; the caller then raises :class:`PeerFailed`
  with the reason the watcher found. Registering a wait is a set insertion;
  the watcher is woken only when it was idle (it ticks every 50 ms while a
  wait is in progress, and sleeps on an event when none is). What this
  relies on: that a timed-out wait on a send or receive ends the waits of
  other threads on it (the group is broken anyway, and commlib aborts it);
  and the caller's thread blocks in the engine's wait, where Ctrl-C is seen
  only when the wait ends, as with torch's own ``recv``;
* otherwise (a point-to-point work of an engine not known to end that way):
  a waiter thread, kept for the next wait, waits on the work while the
  caller's thread looks; the engine's own timeout ends a wait nobody watches
  any more. A work that reports itself complete already is waited on
  directly.
"""

from __future__ import annotations

import datetime
import os
import queue
import threading
import time
from typing import Any, NoReturn

from commlib import _failure_notes
from commlib.types import Work
from commlib.works import ThenWork, WorkList

# when to look in the store: after the first, then twice as long each time, up to the last
_FIRST_LOOK, _LAST_LOOK = 0.05, 1.0


class PeerFailed(RuntimeError):
    """Another rank announced that the group broke while this one was waiting."""

    def __init__(self, reason: str, timed_out: bool, lost: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.timed_out = timed_out
        self.lost = lost


def _look(group: Any) -> None:
    earlier = _failure_notes.broken_elsewhere(group)
    if earlier is not None:
        raise PeerFailed(*earlier)


def wait_watching(
    work: Work, limit: datetime.timedelta, group: Any, interrupt: bool = False
) -> None:
    """``work.wait(limit)``, or :class:`PeerFailed` as soon as another rank says ``group`` broke.

    ``interrupt``: the engine ends the group's pending operations when a
    point-to-point wait times out (:attr:`commlib.Backend.p2p_timeout_ends_group`),
    so a point-to-point ``work`` is waited on in this thread and ended by the
    watcher thread if the group is announced broken meanwhile.

    Examples:
        >>> wait_watching(work, datetime.timedelta(seconds=30), group, True)  # doctest: +SKIP
    """
    if getattr(work, "interruptible", True):
        _in_slices(work, limit, group)
    else:
        wait_point_to_point(work, limit, group, interrupt)


def wait_point_to_point(
    work: Work, limit: datetime.timedelta, group: Any, interrupt: bool = False
) -> None:
    """:func:`wait_watching` for an engine's own point-to-point ``work``.

    In slices only where ``work`` says its wait only waits (``interruptible``:
    MPI's requests); otherwise as the module's notes say.

    For a send's or receive's work as the engine returned it, which does not
    say it is point to point (a :class:`~commlib.backend.WorkList` does).

    Examples:
        >>> wait_point_to_point(work, datetime.timedelta(seconds=30), group, True)
        ... # doctest: +SKIP
    """
    if interrupt:
        _interruptibly(work, limit, group)
    elif getattr(work, "interruptible", False):
        # a work that says its wait only waits (MPI's requests): in slices, as a collective
        _in_slices(work, limit, group)
    elif work.is_completed():
        # nothing left to wait for (an engine whose sends complete at once): its
        # wait returns at once, raising the work's own error if it failed
        work.wait()
    else:
        _beside(work, limit, group)


_FIRST_SLICE = datetime.timedelta(seconds=_FIRST_LOOK)
#: the first slice of a sliced wait: a caller may wait it out itself, then call
#: :func:`wait_watching` if it ran out (the engine's direct calls do)
FIRST_SLICE = _FIRST_SLICE


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


# -- point-to-point waits the watcher can end (gloo's) ----------------------------------
# (every 50 ms while a wait is in progress; a wait's first look after 1-2 ticks, then
# twice as many ticks each time, at most 20: the slices' schedule, to within a tick)
_TICK, _LAST_GAP = _FIRST_LOOK, round(_LAST_LOOK / _FIRST_LOOK)
# the watcher's own wait: long enough to time out as a wait, short enough to be at once
_SHORT = datetime.timedelta(milliseconds=1)


class _Wait:
    """One point-to-point wait in progress in a caller's thread, and why it was ended."""

    __slots__ = ("gap", "group", "left", "why", "work")

    def __init__(self, work: Work, group: Any):
        self.work, self.group = work, group
        # the watcher's schedule, in ticks: to the next look, between looks
        self.left, self.gap = 2, 1
        # set by the watcher before it touches the work: the announced failure
        self.why: tuple[str, bool, bool] | None = None


#: the waits in progress (set.add, discard and copy are atomic)
_waits: set[_Wait] = set()
#: the watcher sleeps on _wake, or was never started: the next wait wakes it
_idle = True
_wake = threading.Event()
_watcher: threading.Thread | None = None
# held by the watcher from deciding to end a wait until it let go of the work
_interrupting = threading.Lock()
_starting = threading.Lock()


def _interruptibly(work: Work, limit: datetime.timedelta, group: Any) -> None:
    wait = _Wait(work, group)
    _waits.add(wait)
    if _idle:
        _wake_watcher()
    try:
        work.wait(limit)
    except BaseException:
        _waits.discard(wait)
        if wait.why is not None:
            _interrupted(wait.why)
        raise
    _waits.discard(wait)
    if wait.why is not None:
        # completed just as the watcher ended it: the group is broken all the same
        _interrupted(wait.why)


def _interrupted(why: tuple[str, bool, bool]) -> NoReturn:
    with _interrupting:  # once the watcher lets go, it touches the work no more
        pass
    raise PeerFailed(*why)


def _wake_watcher() -> None:
    global _idle, _watcher
    _idle = False  # by this caller: the waits after it need not wake the watcher too
    with _starting:
        if _watcher is None:
            _watcher = threading.Thread(target=_watch, name="commlib-watch", daemon=True)
            _watcher.start()
    _wake.set()


def _watch() -> None:
    """The watcher thread: a tick every 50 ms while waits are in progress, asleep when none."""
    global _idle, _watcher
    try:
        while True:
            if not _waits:
                _idle = True
                if not _waits:  # a wait registered before _idle was set did not wake us
                    _wake.wait()
                _wake.clear()
                # busy for a tick at least: waits that come and go in a loop wake it
                # once a tick at most, not once a wait
                _idle = False
            # in a call of its own: no reference to a finished wait's work while asleep
            _tick(_waits.copy())
            time.sleep(_TICK)
    finally:  # only if this thread failed: the next wait starts another
        _watcher, _idle = None, True


def _tick(waits: set[_Wait]) -> None:
    """Look in the store for the waits whose look is due; end those on a broken group."""
    found: dict[int, tuple[str, bool, bool] | None] = {}  # id(group) -> why it broke
    for wait in waits:
        wait.left -= 1
        if wait.left == 0:
            wait.gap = wait.left = min(2 * wait.gap, _LAST_GAP)
            if id(wait.group) not in found:
                found[id(wait.group)] = _failure_notes.broken_elsewhere(wait.group)
    for wait in waits:  # every wait on a group found broken, due or not
        why = found.get(id(wait.group))
        if why is not None:
            _interrupt(wait, why)


def _interrupt(wait: _Wait, why: tuple[str, bool, bool]) -> None:
    """End ``wait``'s engine wait: a short wait on its work times out, which ends the group's.

    Until one raises, or the caller is done: a short wait that completes
    instead (it took the completion the caller waited for) leaves the caller
    waiting, so the next one times out. With several works, each is waited on:
    a timed-out wait on any of them ends the one the caller is in.
    """
    with _interrupting:
        wait.why = why  # first: a caller that finds it set waits for this lock
        works = _engine_works(wait.work)
        while wait in _waits:
            for work in works:
                try:
                    work.wait(_SHORT)
                except Exception:  # the timeout that ended the group's operations
                    return
            time.sleep(_SHORT.total_seconds())


def _engine_works(work: Any) -> list[Any]:
    """The engine's own works inside ``work`` (waiting on a ThenWork would run its step)."""
    if isinstance(work, WorkList):
        return [w for part in work.works for w in _engine_works(part)]
    if isinstance(work, ThenWork):
        return _engine_works(work.work)
    return [work]


# -- other point-to-point waits: a waiter thread waits, the caller looks -----------------


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
    2-core machine; idle waiters are kept in :data:`_idle_waiters` instead. A waiter
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
                _idle_waiters.append(self)  # first: the caller's next wait may reuse this thread
                job.done.release()


#: waiters with nothing to wait for (list.append and pop are atomic)
_idle_waiters: list[_Waiter] = []


def _forget_threads() -> None:
    """In a forked child: none of the parent's threads, nor the locks they held."""
    global _watcher, _idle, _wake, _interrupting, _starting
    _idle_waiters.clear()
    _waits.clear()
    _watcher, _idle = None, True
    _wake, _interrupting, _starting = threading.Event(), threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_forget_threads)


def _beside(work: Work, limit: datetime.timedelta, group: Any) -> None:
    job = _Job(work, limit)
    try:
        waiter = _idle_waiters.pop()
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
