"""Reading the statistics files: tables by op and size, and the cross-rank straggler view.

Each rank writes its own ``commlib_stats_rank<R>.json``
(:mod:`commlib.observe.stats`); this merges them, so nothing is sent between
the ranks. The straggler view lines up each collective's arrival times (its
``start`` on each rank, by communicator and sequence number, which are the
same on every rank): the rank that arrives last, and the spread (last
arrival minus first) the others waited for it. The times are each host's
wall clock: across machines, their clocks' offsets are in the figures.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from commlib.bandwidth import BUSBW_FACTORS, algbw

_PREFIX = "commlib_stats_rank"


def size_label(nbytes: int) -> str:
    """A size row's label: ``"<= 4 KiB"``.

    Examples:
        >>> size_label(0), size_label(512), size_label(4096), size_label(1 << 30)
        ('0 B', '<= 512 B', '<= 4 KiB', '<= 1 GiB')
    """
    if nbytes <= 0:
        return "0 B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"<= {nbytes:g} {unit}"
        nbytes //= 1024
    return f"<= {nbytes} TiB"  # never reached: the loop returns at TiB


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def _gbps(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.3f}"


def bandwidths(row: dict[str, Any]) -> tuple[float | None, float | None]:
    """algbw and busbw in GB/s of a size row: its mean bytes over its median time.

    Examples:
        >>> row = {"name": "all_reduce", "calls": 2, "bytes": 2e9, "median_seconds": 1.0,
        ...        "world_size": 2}
        >>> bandwidths(row)
        (1.0, 1.0)
    """
    if not row["calls"] or not row["bytes"] or row["median_seconds"] <= 0:
        return None, None
    alg = algbw(row["bytes"] / row["calls"], row["median_seconds"])
    factor = BUSBW_FACTORS.get(row["name"])
    return alg, None if factor is None else alg * factor(int(row["world_size"]))


def size_table(rows: list[dict[str, Any]], title: str) -> list[str]:
    """The rows by op and size as lines of text (nothing when there are none).

    Examples:
        >>> row = {"name": "all_reduce", "bucket": 4096, "world_size": 2, "calls": 3,
        ...        "errors": 0, "bytes": 12288, "median_seconds": 1e-4, "max_seconds": 2e-4}
        >>> print("\\n".join(size_table([row], "by op and size")))
        by op and size:
          collective  size      ranks  calls  median ms  max ms  algbw GB/s  busbw GB/s  errors
          all_reduce  <= 4 KiB      2      3      0.100   0.200       0.041       0.041       0
    """
    if not rows:
        return []
    head = (
        "collective",
        "size",
        "ranks",
        "calls",
        "median ms",
        "max ms",
        "algbw GB/s",
        "busbw GB/s",
        "errors",
    )
    lines = [head]
    for r in rows:
        alg, bus = bandwidths(r)
        lines.append(
            (
                r["name"],
                size_label(int(r["bucket"])),
                str(r["world_size"]),
                str(r["calls"]),
                _ms(r["median_seconds"]),
                _ms(r["max_seconds"]),
                _gbps(alg),
                _gbps(bus),
                str(r["errors"]),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = [f"{title}:"]
    for line in lines:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))]
        out.append("  " + "  ".join(cells))
    return out


def read(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every rank's statistics file in ``directory`` (unreadable ones left out), by rank.

    Examples:
        >>> import tempfile
        >>> read(tempfile.mkdtemp())
        []
    """
    found = []
    for path in Path(directory).glob(f"{_PREFIX}*.json"):
        try:
            data = json.loads(path.read_text())
            int(data["rank"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.append(data)
    return sorted(found, key=lambda d: int(d["rank"]))


def merge_sizes(files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One size row per collective, size and group size for all ranks.

    Calls are the most any rank made; times are the slowest rank's (a
    collective ends when its last rank does); errors add up.
    """
    merged: dict[tuple[str, int, int], dict[str, Any]] = {}
    for f in files:
        for r in f.get("sizes") or ():
            key = (r["name"], int(r["bucket"]), int(r["world_size"]))
            m = merged.get(key)
            if m is None:
                merged[key] = dict(r)
                continue
            if r["calls"] > m["calls"]:
                m["calls"], m["bytes"] = r["calls"], r["bytes"]
            m["errors"] += r["errors"]
            m["median_seconds"] = max(m["median_seconds"], r["median_seconds"])
            m["max_seconds"] = max(m["max_seconds"], r["max_seconds"])
    return [merged[k] for k in sorted(merged)]


def stragglers(files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per communicator: which rank arrives last at its collectives, and how long others wait.

    Only collectives every member recorded count (each keeps its last
    arrivals). ``spread`` of a collective is its last arrival minus its first.
    """
    by_rank = {int(f["rank"]): f for f in files}
    members: dict[str, list[int]] = {}
    for f in files:
        for group, ranks in (f.get("members") or {}).items():
            members.setdefault(group, [int(r) for r in ranks])
    out = []
    for group, ranks in sorted(members.items()):
        starts: dict[int, dict[int, float]] = {}
        for r in ranks:
            kept = (by_rank.get(r) or {}).get("arrivals", {}).get(group)
            if kept:
                starts[r] = dict(zip(kept["seqs"], kept["starts"]))
        if len(ranks) < 2 or len(starts) < len(ranks):
            continue  # a member's file is missing: nobody to compare it with
        common = set.intersection(*(set(s) for s in starts.values()))
        last: dict[int, list[float]] = {r: [] for r in ranks}
        spreads = []
        for seq in common:
            times = {r: starts[r][seq] for r in ranks}
            latest = max(times, key=lambda r: times[r])
            spread = times[latest] - min(times.values())
            last[latest].append(spread)
            spreads.append(spread)
        if not spreads:
            continue
        spreads.sort()
        out.append(
            {
                "group": group,
                "ranks": ranks,
                "collectives": len(spreads),
                "median_spread": spreads[len(spreads) // 2],
                "max_spread": spreads[-1],
                "per_rank": {
                    str(r): {
                        "last": len(w),
                        "waited_median": sorted(w)[len(w) // 2] if w else 0.0,
                        "waited_max": max(w) if w else 0.0,
                        "waited_total": sum(w),
                    }
                    for r, w in last.items()
                },
            }
        )
    return out


def merge(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Every rank's statistics in ``directory``: size rows and the straggler view.

    Examples:
        >>> import tempfile
        >>> merge(tempfile.mkdtemp())["ranks"]
        []
    """
    files = read(directory)
    return {
        "directory": str(directory),
        "ranks": [int(f["rank"]) for f in files],
        "world_size": max([int(f.get("world_size", 1)) for f in files] + [0]),
        "sizes": merge_sizes(files),
        "stragglers": stragglers(files),
    }


def render(merged: dict[str, Any]) -> str:
    """The merged statistics as ``commlib stats DIR`` prints them.

    Examples:
        >>> import tempfile
        >>> print(render(merge(tempfile.mkdtemp())))  # doctest: +ELLIPSIS
        commlib stats ...: no statistics files
    """
    if not merged["ranks"]:
        return f"commlib stats {merged['directory']}: no statistics files"
    ranks = ", ".join(map(str, merged["ranks"]))
    lines = [
        f"commlib stats {merged['directory']}: world size {merged['world_size']}, "
        f"files from ranks {ranks}"
    ]
    missing = sorted(set(range(merged["world_size"])) - set(merged["ranks"]))
    if missing:
        lines.append(f"  missing files: ranks {', '.join(map(str, missing))}")
    lines += size_table(merged["sizes"], "by op and size, every rank (slowest rank's times)")
    for s in merged["stragglers"]:
        lines.append(
            f"stragglers, group {s['group']}: {s['collectives']} collectives every rank "
            f"recorded; the last arrival came {_ms(s['median_spread'])} ms after the first "
            f"(median), {_ms(s['max_spread'])} ms at most"
        )
        head = (
            "rank",
            "last to arrive",
            "share",
            "others waited: median ms",
            "max ms",
            "total ms",
        )
        rows = [head]
        for r, p in sorted(s["per_rank"].items(), key=lambda kv: int(kv[0])):
            rows.append(
                (
                    r,
                    str(p["last"]),
                    f"{100 * p['last'] / s['collectives']:.0f}%",
                    _ms(p["waited_median"]),
                    _ms(p["waited_max"]),
                    _ms(p["waited_total"]),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
        for row in rows:
            lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)))
    return "\n".join(lines)


def last_to_write(directory: Path, snapshot: dict[str, Any]) -> bool:
    """Whether this rank's file completes the run's set: then it, and only it, prints the view.

    Files written before this run started are not the run's. The first rank
    to find the set complete takes a marker named after the run's pids.
    """
    world = int(snapshot.get("world_size", 1))
    if world < 2:
        return False
    since = float(snapshot.get("started", 0.0))
    files = [f for f in read(directory) if float(f.get("written", 0.0)) >= since]
    if {int(f["rank"]) for f in files} != set(range(world)):
        return False
    run = hashlib.sha1(repr(sorted((f["rank"], f.get("pid")) for f in files)).encode())
    marker = directory / f".commlib_stats_printed_{run.hexdigest()[:12]}"
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        return False
    return True
