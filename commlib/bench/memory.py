"""Peak resident memory a call adds to this process (host RAM, per rank).

On Linux the peak (``VmHWM``) can be reset by writing ``5`` to
``/proc/self/clear_refs``; then the peak after a call minus the resident size
before it is what the call needed at its worst. Where that reset is not
allowed, ``ru_maxrss`` can only grow, so its delta is a lower bound (it shows
only what goes beyond every earlier peak). :func:`method` says which is in use.

glibc can hide a call's temporary buffers from that measurement: it serves
large blocks from the heap or by ``mmap`` depending on a threshold it adjusts
as the program runs, and ``malloc_trim`` cannot hand back the free top of a
thread's own arena (collective engines allocate in their worker threads). So
:func:`single_arena` (before any threads start) puts every thread in the
main arena, and :func:`steady_malloc` (once timing is over: it makes large
allocations slower) pins the threshold; then every temporary buffer shows.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import resource
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

_STATUS = "/proc/self/status"


def _status_kib(field: str) -> int:
    with open(_STATUS) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"{field} not in {_STATUS}")


@cache
def _libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _libc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, to hand freed heap back before a measurement."""
    return getattr(_libc(), "malloc_trim", None)


# mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def _mallopt(param: int, value: int) -> bool:
    mallopt = getattr(_libc(), "mallopt", None)
    return bool(mallopt is not None and mallopt(param, value))


def single_arena() -> bool:
    """Let every thread allocate from glibc's main arena (glibc only).

    Call it before the threads that matter start; returns whether it took
    effect.

    Examples:
        >>> single_arena()      # for the rest of the process  # doctest: +SKIP
        True
    """
    return _mallopt(_M_ARENA_MAX, 1)


def steady_malloc(threshold: int = 128 << 10) -> bool:
    """Serve every allocation above ``threshold`` by ``mmap`` from now on (glibc only).

    Returns whether it took effect. Freed large blocks then go straight
    back to the OS, so :func:`peak_growth` sees each call's temporaries
    every time, not only when the heap happens to have no room.

    Examples:
        >>> steady_malloc()     # for the rest of the process  # doctest: +SKIP
        True
    """
    return _mallopt(_M_MMAP_THRESHOLD, threshold)


@cache
def method() -> str:
    """``"vmhwm"`` when the peak can be reset, else ``"maxrss"`` (a lower bound).

    Examples:
        >>> method()         # on Linux, usually  # doctest: +SKIP
        'vmhwm'
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _status_kib("VmHWM")
        return "vmhwm"
    except OSError:
        return "maxrss"


def _maxrss_kib() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # macOS reports bytes


def peak_growth(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Run ``fn`` once; the bytes by which it raised this process's peak RSS, and its result.

    Memory freed before the call is first returned to the OS (``gc`` and
    ``malloc_trim``), so pages the call reuses still count as growth.

    Examples:
        >>> grown, _ = peak_growth(lambda: bytearray(64 << 20))
        >>> grown >= 64 << 20   # exact with method() "vmhwm"  # doctest: +SKIP
        True
    """
    gc.collect()
    trim = _libc_trim()
    if trim is not None:
        trim(0)
    if method() == "vmhwm":
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_kib("VmRSS")
        result = fn()
        grown = _status_kib("VmHWM") - before
    else:
        before = _maxrss_kib()
        result = fn()
        grown = _maxrss_kib() - before
    return max(0, grown) * 1024, result
