"""Per-collective statistics, kept by a built-in observer: by collective, and by op and size.

For each communicator and collective: count, bytes, total and longest time,
errors. For each collective and message size (the bytes of the operation as
``commlib bench`` counts them, rounded up to a power of two): calls, median
and longest time, algbw and busbw (:mod:`commlib.bandwidth`). And each
collective's arrival time (its ``start``), the last ``arrivals`` of them, from
which :mod:`commlib.observe.stats_report` tells, across the ranks' files,
which rank arrives last and how long the others wait for it: nothing is
sent between ranks to gather any of it.

``COMMLIB_STATS=1`` prints each rank's tables to stderr at exit;
``COMMLIB_STATS=<directory>`` writes ``commlib_stats_rank<R>.json`` there,
and the last rank to write prints the view of every rank (``commlib stats
DIR`` prints it again).
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, TextIO

from commlib import _catalog
from commlib.hookspecs import hookimpl
from commlib.observe import stats_report
from commlib.observe.event import CollectiveEvent

FORMAT = "commlib-stats/1"
DEFAULT_ARRIVALS = 10_000
_SAMPLES = 4096  # durations kept per size row for its median (a uniform sample past that)


class _Size:
    __slots__ = ("calls", "errors", "max_seconds", "nbytes", "samples", "seconds")

    def __init__(self) -> None:
        self.calls = self.errors = self.nbytes = 0
        self.seconds = self.max_seconds = 0.0
        self.samples: list[float] = []

    def add(self, nbytes: int, seconds: float, failed: bool) -> None:
        self.calls += 1
        self.nbytes += nbytes
        self.seconds += seconds
        if seconds > self.max_seconds:
            self.max_seconds = seconds
        if failed:
            self.errors += 1
        if len(self.samples) < _SAMPLES:
            self.samples.append(seconds)
        else:  # reservoir: every call equally likely to be in the sample
            slot = random.randrange(self.calls)
            if slot < _SAMPLES:
                self.samples[slot] = seconds


def bucket(nbytes: int) -> int:
    """The size row ``nbytes`` falls in: the smallest power of two at least ``nbytes``.

    Examples:
        >>> bucket(0), bucket(1), bucket(1000), bucket(1024), bucket(1025)
        (0, 1, 1024, 1024, 2048)
    """
    return 0 if nbytes <= 0 else 1 << (nbytes - 1).bit_length()


class _Row:
    __slots__ = ("count", "errors", "max_seconds", "nbytes", "seconds")

    def __init__(self) -> None:
        self.count = self.errors = self.nbytes = 0
        self.seconds = self.max_seconds = 0.0


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} GiB"  # never reached: the loop returns at GiB


class CollectiveStats:
    """Count, bytes, total and longest time, and errors, per communicator and collective.

    Examples:
        >>> from commlib.observe import CollectiveStats
        >>> from commlib.plugins import plugin_manager
        >>> stats = CollectiveStats()
        >>> _ = plugin_manager().register(stats)
        >>> comm.all_reduce(torch.ones(4))
        >>> [name for rows in stats.as_dict().values() for name in rows]
        ['all_reduce']
        >>> _ = plugin_manager().unregister(stats)
    """

    #: it reads every event's nbytes: the dispatcher makes the payload facts at the start
    commlib_reads_payload = True

    def __init__(self, arrivals: int = DEFAULT_ARRIVALS) -> None:
        self._rows: dict[tuple[str, str], _Row] = {}
        self._sizes: dict[tuple[str, int, int], _Size] = {}  # (collective, bucket, world)
        # (group, seq, start) of the last collectives (not point to point): arrival times
        self._arrivals: deque[tuple[str, int, float]] = deque(maxlen=max(arrivals, 1))
        self._groups: dict[str, list[int]] = {}
        #: this process's world rank, learnt from the first collective
        self.rank: int | None = None
        self.world_size = 1
        self._started = time.time()  # files older than this are another run's

    @hookimpl
    def commlib_collective_end(self, event: CollectiveEvent) -> None:
        """Count ``event`` in its rows and keep its arrival time."""
        if self.rank is None:
            self.rank = event.group_ranks[event.rank]
        row = self._rows.get((event.group, event.name))
        if row is None:
            row = self._rows[(event.group, event.name)] = _Row()
            self._groups.setdefault(event.group, list(event.group_ranks))
            self.world_size = max(self.world_size, max(event.group_ranks) + 1)
        row.count += 1
        sent = event.nbytes  # read once: an event's payload facts are a property
        row.nbytes += sent
        seconds = event.duration or 0.0
        row.seconds += seconds
        row.max_seconds = max(row.max_seconds, seconds)
        failed = event.error is not None
        if failed:
            row.errors += 1
        n = len(event.group_ranks)
        nbytes = sent * n if event.name in _catalog.TIMES_WORLD else sent
        key = (event.name, bucket(nbytes), n)
        size = self._sizes.get(key)
        if size is None:
            size = self._sizes[key] = _Size()
        size.add(nbytes, seconds, failed)
        if not event.point_to_point:
            self._arrivals.append((event.group, event.seq, event.start))

    def as_dict(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{group: {collective: {count, bytes, seconds, max_seconds, errors}}}``."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for (group, name), row in sorted(self._rows.items()):
            out.setdefault(group, {})[name] = {
                "count": row.count,
                "bytes": row.nbytes,
                "seconds": row.seconds,
                "max_seconds": row.max_seconds,
                "errors": row.errors,
            }
        return out

    def sizes(self) -> list[dict[str, Any]]:
        """One row per collective, size and group size: calls, bytes, median and longest time.

        Examples:
            >>> CollectiveStats().sizes()
            []
        """
        out = []
        for (name, size, world), row in sorted(self._sizes.items()):
            samples = sorted(row.samples)
            out.append(
                {
                    "name": name,
                    "bucket": size,
                    "world_size": world,
                    "calls": row.calls,
                    "errors": row.errors,
                    "bytes": row.nbytes,
                    "seconds": row.seconds,
                    "median_seconds": samples[len(samples) // 2] if samples else 0.0,
                    "max_seconds": row.max_seconds,
                }
            )
        return out

    def snapshot(self, rank: int | None = None) -> dict[str, Any]:
        """Everything, as ``commlib_stats_rank<R>.json`` stores it.

        Examples:
            >>> CollectiveStats().snapshot()["format"]
            'commlib-stats/1'
        """
        if rank is None:
            rank = self.rank if self.rank is not None else int(os.environ.get("RANK", 0))
        arrivals: dict[str, dict[str, list[Any]]] = {}
        for group, seq, start in list(self._arrivals):
            kept = arrivals.setdefault(group, {"seqs": [], "starts": []})
            kept["seqs"].append(seq)
            kept["starts"].append(start)
        return {
            "format": FORMAT,
            "rank": rank,
            "world_size": max(self.world_size, int(os.environ.get("WORLD_SIZE", 1))),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": self._started,
            "written": time.time(),
            "groups": self.as_dict(),
            "members": dict(self._groups),
            "sizes": self.sizes(),
            "arrivals": arrivals,
        }

    def table(self, rank: int | None = None) -> str:
        """The statistics as text: by collective, then by op and size.

        Examples:
            >>> print(CollectiveStats().table())
            commlib statistics, rank 0: no collectives
        """
        if rank is None:
            rank = self.rank if self.rank is not None else 0
        if not self._rows:
            return f"commlib statistics, rank {rank}: no collectives"
        head = ("group", "collective", "calls", "bytes", "total ms", "mean us", "max ms", "errors")
        lines = [head]
        for (group, name), r in sorted(self._rows.items()):
            lines.append(
                (
                    group,
                    name,
                    str(r.count),
                    _size(r.nbytes),
                    f"{r.seconds * 1e3:.1f}",
                    f"{r.seconds / r.count * 1e6:.0f}",
                    f"{r.max_seconds * 1e3:.1f}",
                    str(r.errors),
                )
            )
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
        text = [f"commlib statistics, rank {rank}:"]
        for line in lines:
            cells = [
                c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))
            ]
            text.append("  " + "  ".join(cells))
        text += stats_report.size_table(self.sizes(), f"by op and size, rank {rank}")
        return "\n".join(text)

    def report(
        self, destination: str, rank: int | None = None, stream: TextIO | None = None
    ) -> Path | None:
        """Print the table (``destination`` ``"1"``/``"stderr"``) or write JSON into a directory.

        Examples:
            >>> import tempfile
            >>> CollectiveStats().report(tempfile.mkdtemp()).name
            'commlib_stats_rank0.json'
        """
        if rank is None:
            rank = self.rank if self.rank is not None else int(os.environ.get("RANK", 0))
        if destination.lower() in ("1", "true", "yes", "on", "stderr"):
            print(self.table(rank), file=stream or sys.stderr)
            return None
        target = Path(destination) / f"commlib_stats_rank{rank}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        snapshot = self.snapshot(rank)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(snapshot, indent=1))
        os.replace(tmp, target)  # a reader never sees half a file
        if stats_report.last_to_write(Path(destination), snapshot):
            merged = stats_report.render(stats_report.merge(Path(destination)))
            print(merged, file=stream or sys.stderr)
        return target
