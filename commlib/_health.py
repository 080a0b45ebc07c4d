"""Whether a process group can still be used, shared by every communicator over it.

A timeout or a peer's failure leaves a process group in an unknown state: an
abandoned call may still pair with a late peer's message, so the next call
would match the wrong one. The first such failure marks the group broken, and
every later call on any communicator over that group raises
:class:`~commlib.errors.CommBrokenError` at once, before anything is sent.

The state lives here rather than on a communicator because several
communicators may share one process group. A group that is ``None`` (backends
without one, such as ``single``) gets a state of its own per engine.
"""

from __future__ import annotations

import datetime
import weakref
from typing import Any

from commlib.errors import CommBrokenError

_states: weakref.WeakKeyDictionary[Any, GroupHealth] = weakref.WeakKeyDictionary()


class GroupHealth:
    """One process group's state: why it broke (if it did) and the engine's bound wait.

    Examples:
        >>> health = GroupHealth()
        >>> health.check("all_reduce")
        >>> health.mark_broken("all_reduce #3 timed out on rank 0")
        True
        >>> health.check("broadcast")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        commlib.errors.CommBrokenError: broadcast: the communicator is broken ...
    """

    __slots__ = ("broken", "engine_timeout", "shrinks")

    def __init__(self) -> None:
        self.broken: str | None = None
        # what the engine's own per-operation timeout was last set to (None: not yet)
        self.engine_timeout: datetime.timedelta | None = None
        # how many times the surviving ranks shrank this group: names each attempt
        self.shrinks = 0

    def check(self, what: str) -> None:
        """Raise :class:`~commlib.errors.CommBrokenError` if the group broke earlier."""
        if self.broken is not None:
            raise CommBrokenError(
                f"{what}: the communicator is broken ({self.broken}) and its process group "
                "cannot be used again. On the surviving ranks, call comm.shrink() (or "
                "commlib.shrink() for the default communicator) for a communicator over the "
                "ranks still alive; otherwise end the process and restart the job."
            )

    def mark_broken(self, reason: str) -> bool:
        """Record the first failure; ``True`` if this call is what broke the group."""
        if self.broken is not None:
            return False
        self.broken = reason
        return True


def health_of(group: Any) -> GroupHealth:
    """The shared state of ``group`` (a fresh one for ``None``).

    Examples:
        >>> health_of(None) is health_of(None)
        False
    """
    if group is None:
        return GroupHealth()
    state = _states.get(group)
    if state is None:
        state = _states[group] = GroupHealth()
    return state
