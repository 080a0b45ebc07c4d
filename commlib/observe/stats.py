"""Per-collective statistics: count, bytes and time, kept by a built-in observer.

``COMMLIB_STATS=1`` prints each rank's table to stderr at exit;
``COMMLIB_STATS=<directory>`` writes ``commlib_stats_rank<R>.json`` there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TextIO

from commlib.hookspecs import hookimpl
from commlib.observe.event import CollectiveEvent


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

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], _Row] = {}
        #: this process's world rank, learnt from the first collective
        self.rank: int | None = None

    @hookimpl
    def commlib_collective_end(self, event: CollectiveEvent) -> None:
        """Count ``event`` in its row."""
        if self.rank is None:
            self.rank = event.group_ranks[event.rank]
        row = self._rows.get((event.group, event.name))
        if row is None:
            row = self._rows[(event.group, event.name)] = _Row()
        row.count += 1
        row.nbytes += event.nbytes
        seconds = event.duration or 0.0
        row.seconds += seconds
        row.max_seconds = max(row.max_seconds, seconds)
        if event.error is not None:
            row.errors += 1

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

    def table(self, rank: int | None = None) -> str:
        """The statistics as a text table.

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
            import sys

            print(self.table(rank), file=stream or sys.stderr)
            return None
        target = Path(destination) / f"commlib_stats_rank{rank}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        report = {"rank": rank, "pid": os.getpid(), "groups": self.as_dict()}
        target.write_text(json.dumps(report, indent=1))
        return target
