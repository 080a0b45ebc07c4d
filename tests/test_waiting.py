"""Waiting in slices: a work that completes as a slice ends is complete, not timed out.

torch's ``Work.wait(timeout)`` raises "Operation timed out!" when the work was
not complete at that instant; it may complete right after. Taking that for a
failure once broke a world-4 group in CI: one rank's first all_to_all finished
at the 50 ms slice boundary, the rank called it timed out and the others,
already past it, were told the group broke.
"""

from __future__ import annotations

import datetime

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
