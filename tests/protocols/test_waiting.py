"""Waiting in slices: a work that completes as a slice ends is complete, not timed out.

torch's ``Work.wait(timeout)`` raises "Operation timed out!" when the work was
not complete at that instant; it may complete right after. Taking that for a
failure once broke a world-4 group in CI: one rank's first all_to_all finished
at the 50 ms slice boundary, the rank called it timed out and the others,
already past it, were told the group broke.
"""

from __future__ import annotations

import datetime
import threading
import time

import pytest

from commlib import _waiting


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
