"""One watcher per process for the ends of calls whose futures were asked for.

:meth:`commlib.Handle.get_future` hands its call here: one thread (the
watcher) looks at every pending call in turn, never blocked inside an
engine (a thread there when the interpreter exits aborts the process), and
hands each finished one to a small reused pool that finishes commlib's part
and completes the future, running its callbacks. DDP asks a future of every
gradient bucket: a thread started per call (as before) cost a thread's start
and its own polling per bucket.

The callbacks run on the pool, not on the watcher: a callback may itself
wait for another commlib future (torch's PowerSGD hook does, inside
``then``), which only the watcher can complete. The watcher sleeps while
nothing is pending; it looks again after 0.5 ms, doubling to 5 ms while
calls stay pending, and at once when a new one comes.

Examples:
    >>> watch(handle, complete)   # complete() runs once handle.is_completed()  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from commlib._world import world

__all__ = ["pending", "watch"]

#: the shortest and longest pause between two looks at the pending calls (seconds)
FIRST_PAUSE, LONGEST_PAUSE = 0.0005, 0.005
#: seconds without a job started, jobs waiting, after which the pool starts one more thread
STUCK = 0.02


class _Watched(Protocol):
    def is_completed(self) -> bool: ...


_Entry = tuple[_Watched, Callable[[], None]]


class _Pool:
    """Daemon threads, reused; one more only when jobs wait and none of them moved for a while.

    A callback blocked in a wait (for another future) holds its thread: the
    jobs behind it get a new thread after :data:`STUCK` seconds without a job
    started. Not ``concurrent.futures``: its threads are joined at interpreter
    exit, and a callback waiting there would hold the exit up.
    """

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = self.started = 0
        self.last_start = 0.0  # when a thread last took a job

    def put(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)

    def backlog(self) -> bool:
        return not self.jobs.empty()

    def grow_if_stuck(self) -> None:
        with self.lock:
            if self.jobs.empty() or self.idle:
                return
            if self.started and time.monotonic() - self.last_start < STUCK:
                return
            self.started += 1
            name = f"commlib-future-{self.started}"
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        while True:
            with self.lock:
                self.idle += 1
            job = self.jobs.get()
            with self.lock:
                self.idle -= 1
                self.last_start = time.monotonic()
            job()  # a job sets its future's outcome itself: it does not raise


class _Watcher:
    """The pending calls, the thread looking at them and the pool completing them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.pending: list[_Entry] = []
        self.thread: threading.Thread | None = None
        self.pool = _Pool()
        self.arrivals = 0  # calls watched so far: a new one starts the pauses again

    def watch(self, call: _Watched, complete: Callable[[], None]) -> None:
        with self.lock:
            self.pending.append((call, complete))
            self.arrivals += 1
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._look, name="commlib-futures", daemon=True
                )
                self.thread.start()
            self.arrived.notify()

    def _look(self) -> None:
        pause, seen = FIRST_PAUSE, 0
        while not world.exiting.is_set():
            with self.lock:
                while not self.pending and not self.pool.backlog():
                    self.arrived.wait()  # a daemon thread: nothing to end at exit
                if self.arrivals != seen:  # a new call: look soon again
                    pause, seen = FIRST_PAUSE, self.arrivals
                done, self.pending = _partition(self.pending)
                if not done:
                    # a new call wakes the watcher at once; else look again a little later
                    self.arrived.wait(pause)
                    pause = min(2 * pause, LONGEST_PAUSE)
            for _, complete in done:
                self.pool.put(complete)
            self.pool.grow_if_stuck()

    def count(self) -> int:
        with self.lock:
            return len(self.pending)

    def drop_pending(self) -> None:
        # at exit: the calls' engine works are let go while Python runs (their futures stay
        # pending, as a call left unwaited does)
        with self.lock:
            self.pending = []

    def forget(self) -> None:
        # a forked child has none of the parent's threads: it starts its own when asked
        self.__init__()  # type: ignore[misc]


def _partition(calls: list[_Entry]) -> tuple[list[_Entry], list[_Entry]]:
    done: list[_Entry] = []
    still: list[_Entry] = []
    for entry in calls:
        try:
            finished = entry[0].is_completed()
        except Exception:  # its wait() says what went wrong, into the future
            finished = True
        (done if finished else still).append(entry)
    return done, still


_watcher = _Watcher()
os.register_at_fork(after_in_child=_watcher.forget)
atexit.register(_watcher.drop_pending)


def watch(call: Any, complete: Callable[[], None]) -> None:
    """Run ``complete()`` on the pool once ``call.is_completed()`` is true.

    ``complete`` finishes the call and completes its future; it must not
    raise (it sets the future's exception instead).

    Examples:
        >>> watch(handle, complete)  # doctest: +SKIP
    """
    _watcher.watch(call, complete)


def pending() -> int:
    """How many watched calls have not finished yet (tests, diagnostics).

    Examples:
        >>> pending() >= 0
        True
    """
    return _watcher.count()
