"""The per-process trace: one :class:`Event` per collective, and summaries of them."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass

_lock = threading.Lock()
_events: list[Event] = []


@dataclass
class Event:
    """One collective: what it was, how many bytes it touched, how long it took."""

    op: str
    nbytes: int
    dtype: str
    shape: tuple
    rank: int
    start: float
    seconds: float = 0.0
    detail: str = ""


def record(event: Event) -> None:
    """Add a finished event (and stream it to ``COMMLIB_TRACE_FILE`` when set).

    Examples:
        >>> record(Event("barrier", 0, "-", (), 0, time.time()))
    """
    with _lock:
        _events.append(event)
    path = os.environ.get("COMMLIB_TRACE_FILE")
    if path:
        with open(path.format(rank=event.rank), "a") as f:
            f.write(json.dumps(asdict(event)) + "\n")


def now() -> float:
    return time.perf_counter()


def events() -> list[Event]:
    """Every event recorded in this process so far.

    Examples:
        >>> [e.op for e in events()]
        ['all_reduce', 'all_gather_into_tensor']
    """
    with _lock:
        return list(_events)


def reset() -> None:
    """Forget the recorded events.

    Examples:
        >>> reset(); events()
        []
    """
    with _lock:
        _events.clear()


def summary() -> dict[str, dict[str, float]]:
    """Calls, bytes and seconds per collective.

    Examples:
        >>> summary()["all_reduce"]
        {'calls': 3, 'bytes': 12288, 'seconds': 0.0012}
    """
    out: dict[str, dict[str, float]] = defaultdict(
        lambda: {"calls": 0, "bytes": 0, "seconds": 0.0}
    )
    for e in events():
        row = out[e.op]
        row["calls"] += 1
        row["bytes"] += e.nbytes
        row["seconds"] += e.seconds
    return dict(out)


def format_summary() -> str:
    """:func:`summary` as a table.

    Examples:
        >>> print(format_summary())
        collective               calls        bytes    seconds
        all_reduce                   3        12288     0.0012
    """
    lines = [f"{'collective':<24}{'calls':>6}{'bytes':>13}{'seconds':>11}"]
    for op, row in sorted(summary().items()):
        lines.append(f"{op:<24}{row['calls']:>6}{row['bytes']:>13}{row['seconds']:>11.4f}")
    return "\n".join(lines)
