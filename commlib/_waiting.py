"""Waiting for an engine's work while watching for a failure another rank announced.

A rank waiting on a live peer that already gave up would otherwise learn of
the failure only at its own timeout. The first rank to find a group broken
announces it in the store (:mod:`commlib._failure_notes`); a waiting rank
looks there every so often (after 50 ms, then twice as long each time, at
most every second) and stops with :class:`PeerFailed`.

Only for engines whose collectives' ``Work.wait(timeout)`` merely waits
(:attr:`commlib.Backend.interruptible_wait`): those are waited on in slices.
Point-to-point works are not (gloo ends a receive whose wait timed out), so
one thread waits on them while this one watches; the engine's own timeout
ends that thread.
"""

from __future__ import annotations

import datetime
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
    else:
        _beside(work, limit, group)


def _in_slices(work: Work, limit: datetime.timedelta, group: Any) -> None:
    deadline = time.monotonic() + limit.total_seconds()
    look = _FIRST_LOOK
    while True:
        left = deadline - time.monotonic()
        try:
            work.wait(datetime.timedelta(seconds=max(min(look, left), 0.001)))
            return
        except RuntimeError as exc:
            # torch's Work says this when only the wait's own time ran out
            sliced = "Operation timed out" in str(exc) and not work.is_completed()
            if not sliced or time.monotonic() >= deadline:
                raise
        _look(group)
        look = min(2 * look, _LAST_LOOK)


def _beside(work: Work, limit: datetime.timedelta, group: Any) -> None:
    done = threading.Event()
    failure: list[BaseException] = []

    def waiter() -> None:
        try:
            work.wait(limit)
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=waiter, name="commlib-wait", daemon=True).start()
    look = _FIRST_LOOK
    while not done.wait(look):
        _look(group)
        look = min(2 * look, _LAST_LOOK)
    if failure:
        raise failure[0]
