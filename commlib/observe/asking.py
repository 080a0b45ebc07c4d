"""``commlib stacks DIR``: ask a running job for every rank's stacks, without stopping it.

Each rank with a trace directory leaves its pid there once its rank is known
(``commlib_live_rank<R>.json``, written by the watcher thread). This sends
``SIGUSR1`` to one rank of this machine, which writes its trace file with
every thread's stack and asks the others through the store to do the same
(:mod:`commlib.observe.alarm`); then it waits for their files.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any

from commlib.observe.alarm import process_started
from commlib.observe.trace_files import read_all, read_live

_SLACK = 1.0  # seconds: a rank on another machine may stamp its stacks with a clock behind


def ask_for_stacks(
    directory: str | os.PathLike[str], timeout: float = 15.0
) -> tuple[dict[str, Any], list[int], list[int]]:
    """Signal one live rank of this machine; wait until every rank wrote its stacks.

    Returns the rank signalled (its live file), the ranks that answered and
    those that did not within ``timeout`` seconds. ``LookupError`` when no
    rank of this machine can be signalled (none alive, none listening to
    ``SIGUSR1``, or all on other machines: run it there).

    Examples:
        >>> import tempfile
        >>> ask_for_stacks(tempfile.mkdtemp())
        Traceback (most recent call last):
        ...
        LookupError: no live rank recorded in ...
    """
    live = read_live(directory)
    if not live:
        raise LookupError(
            f"no live rank recorded in {directory} (a rank with COMMLIB_TRACE_DIR set "
            "leaves commlib_live_rank<R>.json there once it knows its rank)"
        )
    host = socket.gethostname()
    asked = time.time()
    chosen = None
    why: list[str] = []
    for info in live:
        pid, rank = int(info["pid"]), int(info["rank"])
        if info.get("host") != host:
            why.append(f"rank {rank} is on {info.get('host')}")
        elif not info.get("signal"):
            why.append(f"rank {rank} does not listen to SIGUSR1 (the program handles it)")
        elif info.get("started") is not None and process_started(pid) != info["started"]:
            why.append(f"rank {rank} (pid {pid}) is gone")
        else:
            os.kill(pid, signal.SIGUSR1)
            chosen = info
            break
    if chosen is None:
        raise LookupError("no rank of this job to signal here: " + "; ".join(why))
    world = max(int(i.get("world_size", 1)) for i in live)
    expected = set(range(world))
    answered: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snapshots, _ = read_all(directory)
        answered = {
            int(s["rank"])
            for s in snapshots
            if isinstance(s.get("stacks"), dict)
            and float(s["stacks"].get("taken", 0)) >= asked - _SLACK
        }
        if answered >= expected:
            break
        time.sleep(0.1)
    return chosen, sorted(answered), sorted(expected - answered)
