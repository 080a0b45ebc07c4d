"""What a plugin's collectives return, and the rank helper they share: for plugin authors.

A plugin composing a collective from its engine's calls returns a
:class:`ThenWork` (the engine's work, then a step on this rank); one issuing
several point-to-point operations returns a :class:`WorkList`; methods given a
group rank hand torch its world rank through :func:`global_rank`. The base
:class:`commlib.Backend` uses the same.

Examples:
    >>> ThenWork.of(None, lambda: None) is None     # nothing in flight: the step ran
    True
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist

from commlib.types import Group, Work


def global_rank(group: Group, group_rank: int) -> int:
    """Translate a rank within ``group`` into the world rank torch expects.

    Examples:
        >>> global_rank(None, 1)                  # the world: a group rank is a world rank
        1
        >>> sub = dist.new_group([2, 3])          # a world of 4  # doctest: +SKIP
        >>> global_rank(sub, 0)                   # doctest: +SKIP
        2
    """
    if group is None or group is dist.GroupMember.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


class WorkList:
    """Several engine works waited for as one (what ``exchange`` returns).

    Examples:
        >>> works = WorkList([dist.isend(t, 1), dist.irecv(u, 1)])  # on rank 0  # doctest: +SKIP
        >>> works.wait(datetime.timedelta(seconds=5))  # doctest: +SKIP
        True
    """

    # point-to-point operations may end when a wait on them times out (gloo's
    # do), so the engine never waits on them in slices (commlib._waiting)
    interruptible = False

    def __init__(self, works: Sequence[Work | None]):
        self.works: list[Work] = [w for w in works if w is not None]

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if timeout is not None and len(self.works) == 1:
            self.works[0].wait(timeout)  # a send or a receive: no deadline to share
            return True
        deadline = None if timeout is None else time.monotonic() + timeout.total_seconds()
        for work in self.works:
            if deadline is None:
                work.wait()
            else:
                left = max(deadline - time.monotonic(), 0.001)
                work.wait(datetime.timedelta(seconds=left))
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)

    def result(self, async_op: bool) -> WorkList | None:
        """``self`` for an async call; otherwise wait now and return ``None``."""
        if async_op:
            return self
        self.wait()
        return None


class ThenWork:
    """An engine's work followed by a step on this rank (a local reduction, copies out).

    What a plugin returns when it composes a collective from the engine's
    own: the engine call runs asynchronously, and ``then`` runs once, in the
    first ``wait`` that sees it complete. Sliced waits (:mod:`commlib._waiting`)
    treat it as they treat the work inside.

    Examples:
        >>> out = torch.zeros(2)
        >>> work = ThenWork(WorkList([]), lambda: out.fill_(1))
        >>> work.wait(datetime.timedelta(seconds=1)), out
        (True, tensor([1., 1.]))
    """

    def __init__(self, work: Work, then: Callable[[], Any]):
        self.work = work
        self.then: Callable[[], Any] | None = then
        self.interruptible = getattr(work, "interruptible", True)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if timeout is None:
            self.work.wait()
        else:
            self.work.wait(timeout)
        then, self.then = self.then, None
        if then is not None:
            then()
        return True

    def is_completed(self) -> bool:
        return self.work.is_completed()

    @staticmethod
    def of(work: Work | None, then: Callable[[], Any]) -> ThenWork | None:
        """``work`` followed by ``then``; with no work (it finished), ``then`` now and ``None``.

        Examples:
            >>> ThenWork.of(None, lambda: None) is None
            True
        """
        if work is None:
            then()
            return None
        return ThenWork(work, then)
