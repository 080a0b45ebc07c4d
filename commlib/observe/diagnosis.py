"""``commlib trace DIR``: read every rank's flight recorder and say which rank diverged.

Works on the files alone (:mod:`commlib.observe.trace_files`), so they may
come from a job on other machines. For each communicator (group) it lines up
the ranks' collectives by sequence number (the same on every rank) and finds
the first number where they disagree (point-to-point calls, numbered apart
on each rank, are left out of that, and shown where they are a rank's last
call):

* ranks in different collectives, or with a different root, op, dtype or
  shape where the collective needs them equal: "rank 2 called all_reduce #8
  where ranks 0, 1 called broadcast #8";
* ranks that never arrived: "rank 2 never arrived at all_reduce #8 (last:
  all_gather_object #7, completed)";
* ranks that left no file (killed, or the directory was not shared).

:func:`diagnose` returns plain data (``commlib trace --json`` prints it);
:func:`render` turns it into text.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from typing import Any

from commlib import _catalog
from commlib.observe._lines import shorten
from commlib.observe.event import describe
from commlib.observe.stacks import roll_call, where
from commlib.observe.trace_files import read_all

_BAD_STATES = ("failed", "timed out")
_UNKNOWN = 1 << 62  # known from: a number no group reaches
_RANK_FILE = re.compile(r"rank(\d+)\.json:")
# how much of an error's first line, and of why a file was written, a line shows (the
# recorder's own reasons, an error's first 200 characters and what they are about, fit)
_ERROR_WIDTH, _REASON_WIDTH = 160, 320


def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _point_to_point(entry: dict[str, Any]) -> bool:
    # files from before the field existed: the names tell
    return bool(entry.get("point_to_point")) or entry.get("name") in _catalog.POINT_TO_POINT


def _signature(entry: dict[str, Any]) -> tuple[Any, ...]:
    """What must be equal on every rank for the collective to match."""
    peers = tuple(sorted((entry.get("peers") or {}).items()))
    sig: tuple[Any, ...] = (entry["name"], peers, entry.get("op"))
    if entry.get("uniform"):
        sig += (tuple(entry.get("dtypes") or ()), tuple(map(tuple, entry.get("shapes") or ())))
    return sig


def _summary(entry: dict[str, Any], written: float | None) -> dict[str, Any]:
    """One entry as the diagnosis shows it."""
    out = {
        "name": entry["name"],
        "seq": entry["seq"],
        "detail": describe(
            entry.get("peers") or {},
            entry.get("op"),
            entry.get("dtypes") or (),
            entry.get("shapes") or (),
        ),
        "state": entry["state"],
    }
    if entry.get("end") is not None:
        out["seconds"] = round(entry["end"] - entry["start"], 6)
    elif written is not None:
        out["in_flight_seconds"] = round(written - entry["start"], 3)
    if entry.get("error"):
        out["error"] = entry["error"]
    at = _at(entry)
    if at:
        out["at"] = at
    return out


def _at(entry: dict[str, Any]) -> str | None:
    """Where the entry's collective was called: ``train.py:88 (step)``, if recorded."""
    site = entry.get("call_site")
    if not isinstance(site, dict) or not site.get("file"):
        return None
    name = os.path.basename(str(site["file"]))
    return f"{name}:{site.get('line')} ({site.get('function')})"


def _party_at(entries: dict[int, dict[str, Any]]) -> str | None:
    """One call site for ranks that share it; each rank's where they differ."""
    sites = {r: _at(e) for r, e in sorted(entries.items())}
    known = {r: at for r, at in sites.items() if at}
    if not known:
        return None
    if len(set(known.values())) == 1 and len(known) == len(sites):
        return next(iter(known.values()))
    return ", ".join(f"{at} on rank {r}" for r, at in known.items())


def _state_words(summary: dict[str, Any]) -> str:
    words = summary["state"]
    if "seconds" in summary and summary["state"] != "completed":
        words += f" after {summary['seconds']:.1f}s"
    if "in_flight_seconds" in summary:
        words = f"in flight for {summary['in_flight_seconds']:.1f}s"
    return words


def _call(summary: dict[str, Any]) -> str:
    detail = f" ({summary['detail']})" if summary["detail"] else ""
    at = f" at {summary['at']}" if summary.get("at") else ""
    return f"{summary['name']} #{summary['seq']}{detail}{at}"


class _Rank:
    """One rank's collectives on one group, by sequence number, and its last call of any kind."""

    def __init__(self, rank: int, snapshot: dict[str, Any], group: str):
        self.rank = rank
        self.written = snapshot.get("written")
        entries = [e for e in snapshot.get("entries", []) if e.get("group") == group]
        self.by_seq = {int(e["seq"]): e for e in entries if not _point_to_point(e)}
        # the recorder keeps calls in the order they started: a rank stuck in a recv
        # after its last collective shows it
        self.latest = entries[-1] if entries else None
        dropped = int(snapshot.get("recorded", 0)) > len(snapshot.get("entries", []))
        # with older records dropped, numbers below the oldest kept one are unknown here,
        # and every number of a group none of whose records are left (the capacity is
        # shared by every group)
        if not dropped:
            self.known_from = 0
        else:
            self.known_from = min(self.by_seq) if self.by_seq else _UNKNOWN
        self.last_seq = max(self.by_seq) if self.by_seq else 0
        taken = snapshot.get("stacks")
        threads = taken.get("threads") if isinstance(taken, dict) else None
        # where its main thread was when the stacks were taken
        self.now = where(threads) if isinstance(threads, list) else None

    def before(self, seq: int) -> dict[str, Any] | None:
        earlier = [s for s in self.by_seq if s < seq]
        return self.by_seq[max(earlier)] if earlier else None

    def summary(self, entry: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if entry is None else _summary(entry, self.written)


def _diagnose_group(
    name: str, members: list[int], files: dict[int, dict[str, Any]], damaged: list[int]
) -> dict[str, Any] | None:
    ranks = {r: _Rank(r, files[r], name) for r in members if r in files}
    if not any(r.latest for r in ranks.values()):
        return None
    missing = [r for r in members if r not in files]
    out: dict[str, Any] = {
        "group": name,
        "ranks": members,
        "first_disagreement": None,
        "parties": [],
        "never_arrived": [],
        "out_of_step": [],
        "missing_files": missing,
        "unreadable_ranks": [r for r in missing if r in damaged],
        "last": {str(r): rk.summary(rk.latest) for r, rk in ranks.items()},
        "now": {str(r): rk.now for r, rk in ranks.items() if rk.now is not None},
        "late": _late(ranks),
        "verdict": [],
    }
    start = max(rk.known_from for rk in ranks.values())
    seqs = sorted({s for rk in ranks.values() for s in rk.by_seq if s >= start})
    for seq in seqs:
        here = {r: rk.by_seq[seq] for r, rk in ranks.items() if seq in rk.by_seq}
        lacking = [r for r in ranks if r not in here]
        parties: dict[tuple[Any, ...], list[int]] = {}
        for r, entry in here.items():
            parties.setdefault(_signature(entry), []).append(r)
        if len(parties) == 1 and not lacking:
            continue
        out["first_disagreement"] = seq
        for sig_ranks in sorted(parties.values(), key=lambda rs: (-len(rs), rs)):
            first = ranks[sig_ranks[0]].summary(here[sig_ranks[0]])
            assert first is not None
            states = {str(r): _state_words(_summary(here[r], ranks[r].written)) for r in sig_ranks}
            party = {
                "ranks": sig_ranks,
                "name": first["name"],
                "seq": seq,
                "detail": first["detail"],
                "states": states,
                "waiting": all(here[r]["state"] in ("started", "timed out") for r in sig_ranks),
            }
            at = _party_at({r: here[r] for r in sig_ranks})
            if at:
                party["at"] = at
            out["parties"].append(party)
        for r in lacking:
            rk = ranks[r]
            if rk.last_seq < seq:
                # its last call, a point-to-point one after its last collective included
                out["never_arrived"].append({"rank": r, "last": rk.summary(rk.latest)})
            else:
                out["out_of_step"].append(
                    {
                        "rank": r,
                        "before": rk.summary(rk.before(seq)),
                        "after": rk.summary(rk.by_seq[min(s for s in rk.by_seq if s > seq)]),
                    }
                )
        break
    out["verdict"] = _verdict(out, ranks)
    return out


def _verdict(group: dict[str, Any], ranks: dict[int, _Rank]) -> list[str]:
    lines = []
    parties = group["parties"]
    seq = group["first_disagreement"]
    if len(parties) > 1:
        usual = parties[0]  # the most ranks (the lowest ranks on a tie)
        tie = "" if len(usual["ranks"]) > len(parties[1]["ranks"]) else " (no majority)"
        for odd in parties[1:]:
            lines.append(
                f"{_ranks(odd['ranks'])} called {_call(odd)} where "
                f"{_ranks(usual['ranks'])} called {_call(usual)}{tie}"
            )
    for lost in group["never_arrived"]:
        at = parties[0] if parties else None
        target = f"{at['name']} #{seq}" if at else f"#{seq}"
        last = lost["last"]
        where = f" at {last['at']}" if last and last.get("at") else ""
        since = f" (last: {last['name']} #{last['seq']}{where}, {last['state']})" if last else ""
        if at and at.get("at"):
            # where the others are, and where this one was last seen
            verb = "wait in" if at.get("waiting") else "called"
            lines.append(
                f"{_ranks(at['ranks'])} {verb} {target} at {at['at']}; "
                f"rank {lost['rank']} never arrived{since}"
            )
        else:
            lines.append(f"rank {lost['rank']} never arrived at {target}{since}")
        now = group.get("now", {}).get(str(lost["rank"]))
        if now and not now["in_collective"]:
            lines[-1] += f"; rank {lost['rank']} is in {now['at']}, not in a collective"
    for odd in group["out_of_step"]:
        lines.append(
            f"rank {odd['rank']} has no collective #{seq}: it was out of step "
            f"(before: {_call(odd['before']) if odd['before'] else 'nothing'}, "
            f"after: {_call(odd['after'])})"
        )
    for late in group.get("late", ()):
        lines.append(
            f"rank {late['rank']} arrived at {late['name']} #{late['seq']} "
            f"{late['after_seconds']:.1f}s after rank {late['gave_up']} had given up on it "
            "(timed out)"
        )
    damaged = [r for r in group["missing_files"] if r in group.get("unreadable_ranks", ())]
    absent = [r for r in group["missing_files"] if r not in damaged]
    if absent or damaged:
        failing = _failing(ranks)
        where = f"; {failing}" if failing else ""
        said = []
        if absent:
            said.append(f"{_ranks(absent)} left no trace file (killed, or another directory)")
        if damaged:
            said.append(f"{_ranks(damaged)} left a trace file that cannot be read")
        lines.append("; ".join(said) + where)
    if not lines:
        failing = _failing(ranks)
        lines.append(
            "the ranks agree on every collective recorded" + (f"; {failing}" if failing else "")
        )
    return lines


def _late(ranks: dict[int, _Rank]) -> list[dict[str, Any]]:
    """Ranks that started a collective after another rank had timed out in it.

    Their file, written again at their own failure or exit, holds the call the
    others gave up on, so the ranks seem to agree; the times tell. The first
    collective that timed out with a rank arriving after it is the one shown.
    """
    timed_out = sorted(
        {s for rk in ranks.values() for s, e in rk.by_seq.items() if e["state"] == "timed out"}
    )
    for seq in timed_out:
        here = {r: rk.by_seq[seq] for r, rk in ranks.items() if seq in rk.by_seq}
        ends = [
            (e["end"], r)
            for r, e in here.items()
            if e["state"] == "timed out" and isinstance(e.get("end"), (int, float))
        ]
        if not ends:
            continue
        first_end, first = min(ends)
        late = [
            {
                "rank": r,
                "name": e["name"],
                "seq": seq,
                "after_seconds": round(e["start"] - first_end, 3),
                "gave_up": first,
            }
            for r, e in sorted(here.items())
            if isinstance(e.get("start"), (int, float)) and e["start"] > first_end
        ]
        if late:
            return late
    return []


def _failing(ranks: dict[int, _Rank]) -> str:
    """ "ranks 0, 1 failed in all_reduce #5", from each rank's last collective.

    Ranks that stopped in the same collective are named together even when
    they stopped differently (one timed out, its peer saw the connection
    drop): "ranks 0, 1 stopped in all_reduce #5 (rank 0 timed out, rank 1
    failed)".
    """
    by_call: dict[tuple[str, int, int], dict[int, str]] = {}
    entries: dict[tuple[str, int, int], dict[int, dict[str, Any]]] = {}
    for r, rk in ranks.items():
        entry = rk.latest
        if entry is not None and entry["state"] in (*_BAD_STATES, "started"):
            state = "still in" if entry["state"] == "started" else entry["state"]
            # point-to-point numbers are each rank's own: never the same call
            alone = r if _point_to_point(entry) else -1
            by_call.setdefault((entry["name"], entry["seq"], alone), {})[r] = state
            entries.setdefault((entry["name"], entry["seq"], alone), {})[r] = entry
    parts = []
    for key, states in sorted(by_call.items(), key=lambda kv: kv[0][1]):
        name, seq, _ = key
        kinds = sorted(set(states.values()))
        rs = sorted(states)
        at = _party_at(entries[key])
        where = f" at {at}" if at else ""
        if len(kinds) == 1:
            verb = kinds[0]
            if verb == "still in":
                verb = ("was" if len(rs) == 1 else "were") + " still"
            parts.append(f"{_ranks(rs)} {verb} in {name} #{seq}{where}")
        else:
            how = ", ".join(f"rank {r} {states[r]}" for r in rs)
            parts.append(f"{_ranks(rs)} stopped in {name} #{seq}{where} ({how})")
    return "; ".join(parts)


def diagnose(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read every rank's trace file in ``directory`` and find where the ranks diverged.

    Examples:
        >>> import tempfile
        >>> diagnose(tempfile.mkdtemp())["verdict"]
        ['no commlib trace files here']
    """
    snapshots, unreadable = read_all(directory)
    snapshots, stale = _this_run(snapshots)
    files = {int(s["rank"]): s for s in snapshots}
    damaged = [int(m.group(1)) for m in (_RANK_FILE.search(u) for u in unreadable) if m]
    world = max([int(s.get("world_size", 1)) for s in snapshots] + [r + 1 for r in files] + [0])
    out: dict[str, Any] = {
        "directory": str(directory),
        "world_size": world,
        "ranks_with_files": sorted(files),
        "missing_files": [r for r in range(world) if r not in files],
        "unreadable": unreadable,
        "other_run": stale,
        "written_because": {},
        "groups": [],
        "verdict": [],
    }
    out["stacks"] = {
        str(r): snap["stacks"] for r, snap in sorted(files.items()) if snap.get("stacks")
    }
    for r, snap in sorted(files.items()):
        reasons = snap.get("reasons") or [snap.get("reason", "")]
        first = next((x for x in reasons if x and x != "exit"), reasons[-1] if reasons else "")
        out["written_because"][str(r)] = first
    if not files:
        out["verdict"] = ["no commlib trace files here"]
        return out
    groups: dict[str, list[int]] = {}
    for snap in snapshots:
        for name, members in (snap.get("groups") or {}).items():
            groups.setdefault(name, list(members))
    order = sorted(groups, key=lambda g: (not g.startswith("world"), g))
    for name in order:
        found = _diagnose_group(name, groups[name], files, damaged)
        if found is not None:
            out["groups"].append(found)
            prefix = "" if len(groups) == 1 else f"group {name}: "
            out["verdict"] += [prefix + line for line in found["verdict"]]
    if not out["groups"]:
        out["verdict"] = ["the trace files record no collectives"]
        if out["missing_files"]:
            out["verdict"].append(f"{_ranks(out['missing_files'])} left no trace file")
    if stale:
        out["verdict"].append(
            f"the files of {_ranks(sorted(stale))} are from an earlier run and were left out"
        )
    return out


def _this_run(snapshots: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[int, float]]:
    """The snapshots of the run that wrote last, and when each earlier run's file was written.

    A directory reused by a restarted job keeps the files of ranks that wrote
    nothing this time; their records would mix with this run's. Files without
    a run id (no store to ask) are kept; when the newest file has none, all are.
    """
    if not any(s.get("run") for s in snapshots):
        return snapshots, {}
    newest = max(snapshots, key=lambda s: s.get("written") or 0)
    if newest.get("run") is None:
        return snapshots, {}  # the last run's files carry no id: nothing to tell apart by
    keep = [s for s in snapshots if s.get("run") in (None, newest["run"])]
    stale = {int(s["rank"]): s.get("written") or 0.0 for s in snapshots if s not in keep}
    return keep, stale


def _stacks_section(d: dict[str, Any]) -> list[str]:
    taken = {int(r): s for r, s in (d.get("stacks") or {}).items()}
    lines = [""]
    if not taken:
        return [*lines, "no stacks in these files (taken on a failure, a request or SIGUSR1)"]
    why: dict[str, list[int]] = {}
    for r, s in sorted(taken.items()):
        why.setdefault(str(s.get("reason", "")), []).append(r)
    lines.append(
        "stacks (innermost frame last), taken by "
        + "; ".join(f"{_ranks(rs)} because: {shorten(reason, 120)}" for reason, rs in why.items())
    )
    lines += [f"  {line}" for line in roll_call(taken)]
    without = [r for r in d["ranks_with_files"] if r not in taken]
    if without:
        lines.append(f"  {_ranks(without)}: no stacks in the file")
    return lines


def render(diagnosis: dict[str, Any], stacks: bool = False) -> str:
    """The diagnosis as ``commlib trace`` prints it; with ``stacks``, every rank's stacks too.

    Examples:
        >>> import tempfile
        >>> print(render(diagnose(tempfile.mkdtemp())))  # doctest: +ELLIPSIS
        commlib trace ...: no files
        diagnosis:
          no commlib trace files here
    """
    d = diagnosis
    lines = []
    if not d["ranks_with_files"]:
        lines.append(f"commlib trace {d['directory']}: no files")
    else:
        lines.append(
            f"commlib trace {d['directory']}: world size {d['world_size']}, "
            f"files from {_ranks(d['ranks_with_files'])}"
        )
    if d["missing_files"]:
        lines.append(f"  missing files: {_ranks(d['missing_files'])}")
    for problem in d["unreadable"]:
        lines.append(f"  unreadable: {problem}")
    for r, written in d.get("other_run", {}).items():
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(written))
        lines.append(f"  left out: rank {r}'s file is from an earlier run (written {when})")
    reasons: dict[str, list[int]] = {}
    for r, why in d["written_because"].items():
        reasons.setdefault(why, []).append(int(r))
    for why, rs in reasons.items():
        lines.append(f"  written by {_ranks(rs)} because: {shorten(why, _REASON_WIDTH)}")
    for g in d["groups"]:
        lines.append("")
        lines.append(f"group {g['group']} ({_ranks(g['ranks'])})")
        if g["first_disagreement"] is not None:
            lines.append(f"  first disagreement at #{g['first_disagreement']}:")
            width = max([len(_ranks(p["ranks"])) for p in g["parties"]] + [7])
            for p in g["parties"]:
                states = set(p["states"].values())
                state = (
                    states.pop()
                    if len(states) == 1
                    else ", ".join(f"rank {r} {s}" for r, s in p["states"].items())
                )
                lines.append(f"    {_ranks(p['ranks']).ljust(width)}  {_call(p)}: {state}")
            for lost in g["never_arrived"]:
                last = lost["last"]
                where = f"last {_call(last)}: {last['state']}" if last else "no collective at all"
                lines.append(f"    {_ranks([lost['rank']]).ljust(width)}  never arrived ({where})")
        lines.append("  last call of each rank:")
        for r, last in g["last"].items():
            text = f"{_call(last)}: {_state_words(last)}" if last else "none"
            if last and last.get("error"):
                text += f": {shorten(last['error'], _ERROR_WIDTH)}"
            now = g.get("now", {}).get(r)
            if now:
                text += f"; now in {now['at']}" + (
                    "" if now["in_collective"] else " (not in a collective)"
                )
            lines.append(f"    rank {r}: {text}")
    if stacks:
        lines += _stacks_section(d)
    lines.append("diagnosis:")
    lines += [f"  {v}" for v in d["verdict"]]
    return "\n".join(lines)
