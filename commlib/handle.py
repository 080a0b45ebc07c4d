"""``Handle``: what an ``async_op=True`` collective returns."""

from __future__ import annotations

import datetime
from collections.abc import Callable

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
    ):
        self._wait = wait
        self._finish = finish
        self._work = work
        self._done = False

    def wait(self, timeout: datetime.timedelta | float | None = None) -> bool:
        """Block until the collective is complete (at most ``timeout``); returns ``True``."""
        if not self._done:
            if self._wait is not None:
                self._wait(as_timedelta(timeout))
            if self._finish is not None:
                self._finish()
            self._done = True
        return True

    def is_completed(self) -> bool:
        """Whether the engine has finished; ``wait()`` is still needed for commlib's part."""
        return self._done or (self._work is not None and self._work.is_completed())

    def __repr__(self) -> str:
        return f"<Handle {'done' if self._done else 'pending'}>"
