"""Where a collective was called from: the first frame outside commlib (and torch).

A walk up ``sys._getframe()`` from inside the collective, made only when an
observer asks (the flight recorder does; a third-party observer sets
``commlib_call_sites = True``, or calls :func:`call_site` from its start hook).
Each code object is judged once (inside commlib's package or its built-in
backends, or not), so a walk costs a dictionary look-up per frame. torch's
own frames are passed over too: a collective torch issues on a group commlib
serves (DDP's gradient bucket, in autograd's backward) was called by the
program's line that called torch (``loss.backward()``).
"""

from __future__ import annotations

import os
import sys
from types import CodeType, FrameType
from typing import Any, NamedTuple

import torch

# commlib's own directory, and the built-in backends' (commlib_backends/): frames
# there are commlib's, not the caller's
_COMMLIB = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROOTS = tuple(
    os.path.join(os.path.dirname(_COMMLIB), name) + os.sep
    for name in ("commlib", "commlib_backends")
)
# ... except `commlib bench`: a program written against commlib, as a user's is; its
# calls' sites are its own lines (else each call would walk up to the console script)
_CLIENTS = (os.path.join(_COMMLIB, "bench") + os.sep,)
# torch's package: its frames call collectives on the program's behalf (commlib.torch_backend)
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_inside: dict[CodeType, bool] = {}
# the function's qualified name (Class.method) where Python has it (3.11 on)
_NAME = "co_qualname" if sys.version_info >= (3, 11) else "co_name"


class CallSite(NamedTuple):
    """A frame of the caller's: file, line and function.

    Examples:
        >>> site = CallSite("/job/train.py", 88, "step")
        >>> site.short()
        'train.py:88 (step)'
    """

    file: str
    line: int
    function: str

    def short(self) -> str:
        """``file.py:LINE (function)``, the words ``commlib trace`` uses."""
        return f"{os.path.basename(self.file)}:{self.line} ({self.function})"

    def as_dict(self) -> dict[str, Any]:
        """The call site as trace and statistics files store it.

        Examples:
            >>> CallSite("train.py", 3, "main").as_dict()
            {'file': 'train.py', 'line': 3, 'function': 'main'}
        """
        return {"file": self.file, "line": self.line, "function": self.function}


def is_commlib_file(filename: str) -> bool:
    """Whether ``filename`` is in commlib's package or its built-in backends.

    ``commlib bench`` is not: it calls commlib as a program does.

    Examples:
        >>> is_commlib_file(__file__), is_commlib_file("/job/train.py")
        (True, False)
    """
    return filename.startswith(_ROOTS) and not filename.startswith(_CLIENTS)


def is_commlib(code: CodeType) -> bool:
    """Whether ``code`` is commlib's (its package or its built-in backends).

    Examples:
        >>> is_commlib(is_commlib.__code__)
        True
    """
    found = _inside.get(code)
    if found is None:
        found = _inside[code] = is_commlib_file(code.co_filename)
    return found


def site_of(frame: FrameType) -> CallSite:
    """The call site ``frame`` is at.

    Examples:
        >>> site_of(sys._getframe()).function
        '<module>'
    """
    code = frame.f_code
    return CallSite(code.co_filename, frame.f_lineno, getattr(code, _NAME))


def caller_of(frame: FrameType | None) -> CallSite | None:
    """The first frame outside commlib from ``frame`` up (``frame`` itself, if it is).

    Examples:
        >>> caller_of(sys._getframe()).function
        '<module>'
    """
    f = frame
    while f is not None:
        code = f.f_code
        # by the code's id: hashing a code object hashes its constants, each time
        known = sites_by_code.get(id(code))
        if known is None or known[0] is not code:
            known = _judged(code)
        if known[1] is None:  # commlib's
            f = f.f_back
            continue
        # the same call (code and instruction) is at the same line: its site made once
        sites = known[1]
        site = sites.get(f.f_lasti)
        if site is None:
            site = sites[f.f_lasti] = site_of(f)
        return site
    return None


# id(code) -> (code, None for commlib's, else its call sites by instruction): the
# code is held, so that its id is not reused while it is here; bounded, for
# programs that compile code as they go
sites_by_code: dict[int, tuple[CodeType, dict[int, CallSite] | None]] = {}
_BY_ID_KEPT = 4096


def _judged(code: CodeType) -> tuple[CodeType, dict[int, CallSite] | None]:
    if len(sites_by_code) >= _BY_ID_KEPT:
        sites_by_code.clear()
    passed_over = is_commlib(code) or code.co_filename.startswith(_TORCH)
    found = sites_by_code[id(code)] = (code, None if passed_over else {})
    return found


def call_site(frame: FrameType | None = None) -> CallSite | None:
    """The first frame outside commlib below commlib's own, from ``frame`` (the caller's) up.

    Called from inside a collective (its start hook, say), that is the line
    of the program that called it. Frames outside commlib above commlib's
    (an observer's hook that asks) are passed over first. ``None`` when no
    commlib frame is on the stack.

    Examples:
        >>> call_site() is None   # not inside a collective
        True
    """
    f: FrameType | None = sys._getframe(1) if frame is None else frame
    while f is not None and not is_commlib(f.f_code):
        f = f.f_back  # an observer's own frames
    return None if f is None else caller_of(f)
