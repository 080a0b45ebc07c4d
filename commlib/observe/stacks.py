"""Every thread's Python stack, as the trace file stores it, and the roll-call that reads them.

The flight recorder takes them when it writes for a failure, a timeout, a
request of another rank or ``SIGUSR1`` (never at exit, where they would only
show the exit). It takes them from whichever Python thread writes (the
watcher thread, for a request or a signal), with ``sys._current_frames()``:
nothing runs inside a signal handler, so a rank blocked in a collective, or
busy in a loop of its own, is read where it is.

Each frame is ``[file, line, function, code, kind]``, outermost first; ``kind``
says whose it is, judged where it was taken (the reader may be on another
machine): ``"commlib"`` (commlib's own), ``"library"`` (the standard library
and installed packages, torch included) or ``"program"`` (everything else,
commlib's test harness included: it runs the program's function).
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import threading
import time
from typing import Any

from commlib.observe.call_site import is_commlib_file

_HARNESS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "testing")
_LIBRARIES = tuple(
    {
        os.path.join(path, "")
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
)
_kinds: dict[str, str] = {}
# the frame every collective runs in, and its observed call
_FRAMES = ("_collective.py", os.path.join("observe", "dispatch.py"))
_OWN_THREADS = ("commlib-trace",)  # the flight recorder's threads (commlib.observe.alarm)


def kind_of(filename: str) -> str:
    """``"commlib"``, ``"library"`` or ``"program"``: whose code ``filename`` is.

    Examples:
        >>> kind_of(threading.__file__)
        'library'
        >>> kind_of("/job/train.py")
        'program'
    """
    found = _kinds.get(filename)
    if found is None:
        if filename.startswith(_HARNESS):
            found = "program"
        elif is_commlib_file(filename):
            found = "commlib"
        elif filename.startswith(_LIBRARIES) or filename.startswith("<frozen"):
            found = "library"
        else:
            found = "program"
        _kinds[filename] = found
    return found


def _frames(frame: Any) -> list[list[Any]]:
    out = []
    f = frame
    while f is not None:
        code = f.f_code
        name = getattr(code, "co_qualname", code.co_name)
        line = f.f_lineno or 0
        text = linecache.getline(code.co_filename, line).strip()
        out.append([code.co_filename, line, name, text, kind_of(code.co_filename)])
        f = f.f_back
    out.reverse()
    return out


def capture(reason: str = "") -> dict[str, Any]:
    """Every thread's stack but the one asking (commlib's writer), outermost frame first.

    The main thread's is first. A thread of the program's own that asks
    (a failing collective's) is kept: it is where the program is.

    Examples:
        >>> taken = capture("asked")
        >>> [t["name"] for t in taken["threads"]][:1]
        ['MainThread']
    """
    me = threading.get_ident()
    names = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads = []
    for ident, frame in sys._current_frames().items():
        thread = names.get(ident)
        if ident == me and ident != main and thread is not None and thread.daemon:
            continue  # the watcher writing this: its own stack says nothing
        if thread is not None and thread.name.startswith(_OWN_THREADS):
            continue  # commlib's watcher, waiting: nothing of the program's
        threads.append(
            {
                "name": thread.name if thread is not None else f"thread {ident}",
                "main": ident == main,
                "daemon": bool(thread.daemon) if thread is not None else None,
                "frames": _frames(frame),
            }
        )
    threads.sort(key=lambda t: (not t["main"], t["name"]))
    return {"taken": time.time(), "reason": reason, "threads": threads}


def where(threads: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Where the main thread is: its innermost frame of the program, and whether in a collective.

    In a collective: inside a ``Communicator`` collective's frame
    (``commlib/_collective.py`` or ``commlib/observe/dispatch.py`` on the
    stack), not merely in commlib code.

    Examples:
        >>> now = where(capture()["threads"])
        >>> sorted(now)
        ['at', 'code', 'in_collective']
    """
    main = next((t for t in threads if t.get("main")), None)
    if main is None or not main.get("frames"):
        return None
    frames = main["frames"]
    program = [f for f in frames if len(f) > 4 and f[4] == "program"]
    file, line, function, code = (program or frames)[-1][:4]
    return {
        "at": f"{os.path.basename(file)}:{line} ({function})",
        "code": code,
        "in_collective": any(
            len(f) > 4 and f[4] == "commlib" and str(f[0]).endswith(_FRAMES) for f in frames
        ),
    }


def _collapsed(frames: Any) -> tuple[Any, ...]:
    """The frames as a key, each run of commlib's own frames as one."""
    out: list[Any] = []
    for f in frames:
        if len(f) > 4 and f[4] == "commlib":
            if not out or out[-1] != "commlib":
                out.append("commlib")
        else:
            out.append(tuple(f[:3]))
    return tuple(out)


def roll_call(stacks: dict[int, dict[str, Any]], width: int = 24) -> list[str]:
    """The ranks' stacks as lines, ranks with the same stack in the same thread together.

    ``stacks`` maps a rank to what :func:`capture` took there. Each stack shows
    its innermost ``width`` frames, innermost last, as a traceback does;
    commlib's own frames in a row are one line, and stacks that differ only
    there are the same (the program's call before that line says which
    collective it is in).

    Examples:
        >>> lines = roll_call({0: capture(), 1: capture()})
        >>> lines[0].startswith("ranks 0, 1: MainThread")
        True
    """
    groups: dict[tuple[Any, ...], list[int]] = {}
    shown: dict[tuple[Any, ...], dict[str, Any]] = {}
    for rank, taken in sorted(stacks.items()):
        for thread in taken.get("threads") or ():
            frames = _collapsed(thread.get("frames") or ())
            key = (not thread.get("main"), thread.get("name"), frames)
            groups.setdefault(key, []).append(rank)
            shown.setdefault(key, thread)
    lines = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], groups[k])):
        ranks = groups[key]
        thread = shown[key]
        who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
        lines.append(f"{who}: {thread.get('name')}")
        kept = thread.get("frames") or []
        if len(kept) > width:
            lines.append(f"    ... {len(kept) - width} outer frames")
        inside = 0
        for f in [*kept[-width:], None]:
            if f is not None and len(f) > 4 and f[4] == "commlib":
                inside += 1
                continue
            if inside:
                lines.append("    ... inside commlib")
                inside = 0
            if f is None:
                break
            file, line, function = f[0], f[1], f[2]
            code = f[3] if len(f) > 3 else ""
            lines.append(f"    {os.path.basename(str(file))}:{line} in {function}")
            if code:
                lines.append(f"        {code}")
    return lines
