"""Waiting in slices: a work that completes as a slice ends is complete, not timed out.

torch's ``Work.wait(timeout)`` raises "Operation timed out!" when the work was
not complete at that instant; it may complete right after. Taking that for a
failure once broke a world-4 group in CI: one rank's first all_to_all finished
at the 50 ms slice boundary, the rank called it timed out and the others,
already past it, were told the group broke.
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time

import pytest

from commlib import _failure_notes, _waiting
from commlib.backend import WorkList


class RacyWork:
    """Complete only after ``slices`` waits gave up; the last gives up as it completes."""

    interruptible = True

    def __init__(self, slices: int, error: str | None = None):
        self.slices = slices
        self.error = error
        self.waits: list[datetime.timedelta | None] = []

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self.waits.append(timeout)
        if self.slices > 0 and timeout is not None:
            self.slices -= 1
            raise RuntimeError("Operation timed out!")
        if self.error:
            raise RuntimeError(self.error)
        return True

    def is_completed(self) -> bool:
        return self.slices == 0


@pytest.mark.parametrize("slices", [1, 3], ids=["first-slice", "later-slice"])
def test_a_work_completing_as_the_slice_ends_counts_as_completed(slices):
    work = RacyWork(slices)
    _waiting.wait_watching(work, datetime.timedelta(seconds=30), None)
    assert work.waits[-1] is None  # looked again, without a limit, once it was complete


def test_a_work_completing_with_an_error_as_the_slice_ends_raises_that_error():
    work = RacyWork(1, error="gloo: connection closed by peer")
    with pytest.raises(RuntimeError, match="connection closed"):
        _waiting.wait_watching(work, datetime.timedelta(seconds=30), None)


class NeverDone:
    interruptible = True

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        raise RuntimeError("Operation timed out!")

    def is_completed(self) -> bool:
        return False


def test_a_work_that_never_completes_times_out_at_the_limit():
    with pytest.raises(RuntimeError, match="Operation timed out"):
        _waiting.wait_watching(NeverDone(), datetime.timedelta(seconds=0.3), None)


class BlockingWork:
    """A point-to-point-like work: ``wait`` blocks until released (never sliced)."""

    interruptible = False

    def __init__(self, error: str | None = None):
        self.release = threading.Event()
        self.error = error
        self.waited_on: threading.Thread | None = None

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self.waited_on = threading.current_thread()
        self.release.wait(None if timeout is None else timeout.total_seconds())
        if self.error:
            raise RuntimeError(self.error)
        return True

    def is_completed(self) -> bool:
        return False  # as gloo's sends and receives report before their wait()


class DoneWork(BlockingWork):
    """A point-to-point work that reports itself complete (torch's fake process group's)."""

    def is_completed(self) -> bool:
        return True


def test_a_completed_point_to_point_work_needs_no_waiter_thread():
    done = DoneWork()
    done.release.set()
    _waiting.wait_watching(done, datetime.timedelta(seconds=30), None)
    assert done.waited_on is threading.current_thread()
    failed = DoneWork(error="gloo: connection closed by peer")
    failed.release.set()
    with pytest.raises(RuntimeError, match="connection closed"):
        _waiting.wait_watching(failed, datetime.timedelta(seconds=30), None)


def test_point_to_point_waits_reuse_one_waiter_thread():
    limit = datetime.timedelta(seconds=30)
    first, second = BlockingWork(), BlockingWork()
    first.release.set()
    second.release.set()
    _waiting.wait_watching(first, limit, None)
    _waiting.wait_watching(second, limit, None)
    assert first.waited_on is second.waited_on
    assert first.waited_on is not threading.current_thread()


def test_a_waiter_hands_the_work_error_to_the_caller():
    work = BlockingWork(error="gloo: connection closed by peer")
    work.release.set()
    with pytest.raises(RuntimeError, match="connection closed"):
        _waiting.wait_watching(work, datetime.timedelta(seconds=30), None)


def test_a_busy_waiter_does_not_delay_the_next_wait():
    stuck, later = BlockingWork(), BlockingWork()
    later.release.set()
    limit = datetime.timedelta(seconds=30)
    caller = threading.Thread(target=_waiting.wait_watching, args=(stuck, limit, None))
    caller.start()
    try:
        for _ in range(1000):  # until a waiter thread holds `stuck`
            if stuck.waited_on is not None:
                break
            time.sleep(0.01)
        assert stuck.waited_on is not None
        _waiting.wait_watching(later, limit, None)  # returns although `stuck` still waits
        assert later.waited_on is not stuck.waited_on
    finally:
        stuck.release.set()
        caller.join(10)


# -- point-to-point waits the watcher ends (gloo's) ---------------------------------------
class Connections:
    """A group's connections, as gloo keeps them: one timed-out wait closes them all."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.closed: str | None = None
        self.log: list[str] = []  # who waited, and how it ended, in order


class GlooLikeWork:
    """A send or receive as gloo's: each completion ends one wait; a wait that times
    out closes the group's connections, which ends every wait on it at once."""

    interruptible = False

    def __init__(self, connections: Connections, on_watcher_wait=None):
        self.conn = connections
        self.completions = 0
        self.on_watcher_wait = on_watcher_wait  # run as a wait from another thread begins
        self.callers: list[threading.Thread] = []

    def complete(self) -> None:
        with self.conn.cv:
            self.completions += 1
            self.conn.cv.notify_all()

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        who = "watcher" if threading.current_thread().name == "commlib-watch" else "caller"
        if who == "watcher" and self.on_watcher_wait is not None:
            self.on_watcher_wait(self)
        conn = self.conn
        with conn.cv:
            self.callers.append(threading.current_thread())
            done = conn.cv.wait_for(
                lambda: conn.closed or self.completions,
                None if timeout is None else timeout.total_seconds(),
            )
            if conn.closed:
                conn.log.append(f"{who} ended")
                raise RuntimeError(conn.closed)
            if not done:
                conn.closed = "Application timeout caused pair closure"
                conn.cv.notify_all()
                conn.log.append(f"{who} timed out")
                raise RuntimeError(f"Timed out waiting {timeout} for recv operation")
            self.completions -= 1
            conn.log.append(f"{who} completed")
            return True

    def is_completed(self) -> bool:
        return False  # as gloo's, before their wait()


LIMIT = datetime.timedelta(seconds=20)
WHY = ("all_reduce #3 on rank 1 timed out", True)


@pytest.fixture
def announced(monkeypatch):
    """Which groups another rank announced broken (the store's answer, per group)."""
    broken: dict[str, tuple[str, bool]] = {}
    looks: list[str] = []

    def broken_elsewhere(group):
        looks.append(group)
        return broken.get(group)

    monkeypatch.setattr(_failure_notes, "broken_elsewhere", broken_elsewhere)
    return broken, looks


def _announce_soon(broken, group, after=0.1):
    timer = threading.Timer(after, broken.__setitem__, (group, WHY))
    timer.start()
    return timer


def test_a_point_to_point_wait_is_waited_on_in_the_callers_thread(announced):
    conn = Connections()
    works = [GlooLikeWork(conn) for _ in range(2)]
    for work in works:
        work.complete()
    _waiting.wait_watching(WorkList(works), LIMIT, "g", interrupt=True)
    assert [w.callers for w in works] == [[threading.main_thread()]] * 2
    assert conn.log == ["caller completed"] * 2
    assert not _waiting._waits  # registered while it waited only


def test_a_long_wait_is_looked_after_and_left_alone_while_the_group_is_fine(announced):
    _, looks = announced
    conn = Connections()
    work = GlooLikeWork(conn)
    threading.Timer(0.4, work.complete).start()
    _waiting.wait_watching(WorkList([work]), LIMIT, "g", interrupt=True)
    assert conn.log == ["caller completed"]
    assert "g" in looks  # the watcher looked (first after 50-100 ms), found nothing


@pytest.mark.parametrize("pending", [1, 3], ids=["one-work", "third-of-three"])
def test_a_wait_on_a_group_announced_broken_ends_with_the_reason(announced, pending):
    broken, _ = announced
    conn = Connections()
    works = [GlooLikeWork(conn) for _ in range(pending)]
    for work in works[:-1]:  # the caller waits on the last one
        work.complete()
    _announce_soon(broken, "g")
    with pytest.raises(_waiting.PeerFailed) as info:
        _waiting.wait_watching(WorkList(works), LIMIT, "g", interrupt=True)
    assert (info.value.reason, info.value.timed_out) == WHY
    assert "pair closure" in str(info.value.__context__)  # the engine's wait, ended
    assert "watcher timed out" in conn.log and conn.log[-1] == "caller ended"


def test_a_wait_on_another_group_is_not_ended(announced):
    broken, _ = announced
    conn = Connections()
    work = GlooLikeWork(conn)
    _announce_soon(broken, "other")
    threading.Timer(0.5, work.complete).start()
    _waiting.wait_watching(WorkList([work]), LIMIT, "g", interrupt=True)
    assert conn.log == ["caller completed"]


def test_a_completion_the_watcher_takes_does_not_leave_the_caller_waiting(announced):
    # the completion arrives as the watcher's short wait begins, and that wait takes
    # it: the caller would wait on until its limit, so the watcher waits again
    broken, _ = announced
    conn = Connections()
    work = GlooLikeWork(conn, on_watcher_wait=lambda w: w.complete() if not conn.log else None)
    _announce_soon(broken, "g")
    started = time.monotonic()
    with pytest.raises(_waiting.PeerFailed):
        _waiting.wait_watching(WorkList([work]), LIMIT, "g", interrupt=True)
    assert time.monotonic() - started < LIMIT.total_seconds() / 2
    assert conn.log == ["watcher completed", "watcher timed out", "caller ended"]


def test_a_wait_completing_as_the_watcher_ends_it_raises_all_the_same(announced):
    # the completion arrives as the watcher begins, and the caller takes it: the
    # group was announced broken, so the caller raises as if its wait had been ended,
    # and only once the watcher let go of the work
    broken, _ = announced
    conn = Connections()

    def complete_for_the_caller(w):
        if not conn.log:
            w.complete()
            for _ in range(1000):
                if conn.log:
                    break
                time.sleep(0.001)

    work = GlooLikeWork(conn, on_watcher_wait=complete_for_the_caller)
    _announce_soon(broken, "g")
    with pytest.raises(_waiting.PeerFailed) as info:
        _waiting.wait_watching(WorkList([work]), LIMIT, "g", interrupt=True)
    conn.log.append("caller raised")
    assert info.value.__context__ is None  # its own wait completed
    assert conn.log[0] == "caller completed"
    time.sleep(0.1)  # the watcher's next tick
    assert conn.log[-1] == "caller raised"  # nothing touched the work after that


def _waiting_elsewhere(group: str) -> tuple[GlooLikeWork, threading.Thread]:
    """A wait in progress in another thread: the watcher is busy while it lasts."""
    held = GlooLikeWork(Connections())
    other = threading.Thread(
        target=_waiting.wait_watching, args=(WorkList([held]), LIMIT, group, True)
    )
    other.start()
    for _ in range(1000):  # until it waits, and the watcher knows it is not idle
        if held.callers and not _waiting._idle:
            break
        time.sleep(0.01)
    assert held.callers and not _waiting._idle
    return held, other


def test_waits_start_no_thread_and_wake_no_busy_watcher(announced, monkeypatch):
    held, other = _waiting_elsewhere("h")
    try:
        wakes, starts = [], []
        wake, start = _waiting._wake_watcher, threading.Thread.start
        monkeypatch.setattr(_waiting, "_wake_watcher", lambda: (wakes.append(1), wake()))
        monkeypatch.setattr(threading.Thread, "start", lambda t: (starts.append(t), start(t)))
        conn = Connections()
        for _ in range(100):
            work = GlooLikeWork(conn)
            work.complete()
            _waiting.wait_watching(WorkList([work]), LIMIT, "g", True)
        assert conn.log == ["caller completed"] * 100
        assert wakes == [] and starts == []
        assert [t.name for t in threading.enumerate()].count("commlib-watch") == 1
    finally:
        held.complete()
        other.join(10)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
# Python 3.12+ warns of forking a process with threads: that is the case under test
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_watches_with_a_watcher_of_its_own(announced):
    broken, _ = announced
    broken["g"] = WHY
    held, other = _waiting_elsewhere("h")  # the parent's watcher is busy as it forks
    try:
        pid = os.fork()
        if pid == 0:  # the child: a wait on the broken group must be ended, not time out
            code = 1
            try:
                work = GlooLikeWork(Connections())
                _waiting.wait_watching(WorkList([work]), datetime.timedelta(seconds=5), "g", True)
            except _waiting.PeerFailed:
                code = 0
            finally:
                os._exit(code)
        for _ in range(2000):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child did not end")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        held.complete()
        other.join(10)
