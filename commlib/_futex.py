"""Sleeping on a word of shared memory until another process changes it (Linux futexes).

A rank waiting for its peers' round numbers (:mod:`commlib._shared_rows`)
sleeps in the kernel on the first missing rank's word and is woken the moment
that rank publishes, as a socket wait is, instead of waking late from a yield
or a nap. The word is the low 32 bits of an int64 round number (little-endian:
the int64's own address), compared by the kernel with the value the waiter
read: a publish between the read and the sleep returns at once, so no wake-up
is missed. The publisher wakes every sleeper on its word after each store,
always (a wake with no sleepers costs a syscall, about a microsecond; a
"someone sleeps" flag read after the store would need a fence on x86 that
Python cannot issue).

Linux on x86-64 and aarch64 only, and not the ``_PRIVATE`` variants: the
mapping is shared between processes. Elsewhere, or where the kernel refuses
the call (a seccomp filter), :meth:`Futex.over` gives ``None`` and the waiter
keeps its naps.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import platform
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}
_WAIT, _WAKE = 0, 1  # FUTEX_WAIT, FUTEX_WAKE: shared between processes (no PRIVATE flag)
_EVERY = 0x7FFFFFFF  # wake this many: all
# what a wait may return besides 0, all meaning "look again": the word was not the
# value read (a publish came first), the time ran out, a signal came
_LOOK_AGAIN = (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _syscall() -> tuple[int, Callable[..., int]] | None:
    number = _SYS_FUTEX.get(platform.machine().lower())
    if not sys.platform.startswith("linux") or number is None or sys.byteorder != "little":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # a prototype of our own (libc.syscall's argtypes are shared with anyone's): addr,
        # op, val, timeout, uaddr2, val3
        proto = ctypes.CFUNCTYPE(
            ctypes.c_long,
            ctypes.c_long,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_uint32,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_uint32,
            use_errno=True,
        )
        return number, proto(("syscall", libc))
    except (OSError, AttributeError):
        return None


_FOUND = _syscall()


class Futex:
    """The 32-bit words of one shared mapping, to sleep on and to wake.

    Keeps a ctypes export of the mapping (its address): :meth:`release` it
    before ``buffer.close()``, which fails while an export lives.

    Examples:
        >>> import mmap
        >>> buffer = mmap.mmap(-1, 4096)
        >>> futex = Futex.over(buffer)
        >>> futex is None or futex.wait(0, 1, 0.01)   # the word is 0, not 1: returns at once
        True
        >>> futex is None or futex.wake(0)
        True
        >>> if futex is not None:
        ...     futex.release()
        >>> buffer.close()
    """

    def __init__(self, buffer: mmap.mmap) -> None:
        assert _FOUND is not None
        self._number, self._call = _FOUND
        self._anchor: ctypes.c_char | None = ctypes.c_char.from_buffer(buffer)
        self.base = ctypes.addressof(self._anchor)

    @classmethod
    def over(cls, buffer: mmap.mmap) -> Futex | None:
        """Futexes on ``buffer``'s words, or ``None`` where this platform or kernel has none."""
        if _FOUND is None:
            return None
        futex = cls(buffer)
        if not futex.wake(0):  # refused (ENOSYS, EPERM): nap instead
            futex.release()
            return None
        return futex

    def wait(self, offset: int, seen: int, seconds: float) -> bool:
        """Sleep while the word at ``offset`` holds ``seen``'s low 32 bits, at most ``seconds``.

        Returns whether the kernel took the wait (woken, timed out, the word
        already changed, a signal); ``False``: it refused, sleep otherwise.
        """
        whole = int(seconds)
        limit = _Timespec(whole, int((seconds - whole) * 1e9))
        low = seen & 0xFFFFFFFF
        got = self._call(
            self._number, self.base + offset, _WAIT, low, ctypes.byref(limit), None, 0
        )
        return got == 0 or ctypes.get_errno() in _LOOK_AGAIN

    def wake(self, offset: int) -> bool:
        """Wake every process asleep on the word at byte ``offset``; whether the kernel took it."""
        return self._call(self._number, self.base + offset, _WAKE, _EVERY, None, None, 0) >= 0

    def release(self) -> None:
        """Drop the export of the mapping (before closing it); no wait or wake after this."""
        self._anchor = None
