"""The flight recorder's files: one JSON file per rank in the trace directory.

The format is plain JSON so that files copied from other machines (or read
by other tools) need nothing of the job that wrote them::

    {"format": "commlib-trace/1", "rank": 2, "world_size": 3, "host": ..., "pid": ...,
     "written": <time.time()>, "reason": "...", "capacity": 2000, "recorded": 41,
     "groups": {"world": [0, 1, 2]},
     "entries": [{"group": "world", "seq": 7, "name": "all_reduce", "rank": 2,
                  "shapes": [[4]], "dtypes": ["float32"], "nbytes": 16, "peers": {},
                  "op": "sum", "uniform": true, "start": ..., "end": ..., "state": "completed",
                  "error": null}, ...]}
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

FORMAT = "commlib-trace/1"
_PREFIX = "commlib_trace_rank"
_LIVE = "commlib_live_rank"  # a live rank's pid and host: ``commlib stacks`` signals it


def path_for(directory: str | os.PathLike[str], rank: int) -> Path:
    """The file rank ``rank`` writes in ``directory``.

    Examples:
        >>> path_for("/tmp/trace", 3).name
        'commlib_trace_rank3.json'
    """
    return Path(directory) / f"{_PREFIX}{rank}.json"


def write(directory: str | os.PathLike[str], snapshot: dict[str, Any]) -> Path:
    """Write one rank's snapshot, whole or not at all (a reader never sees half a file).

    Examples:
        >>> import tempfile
        >>> write(tempfile.mkdtemp(), {"format": FORMAT, "rank": 0, "entries": []}).name
        'commlib_trace_rank0.json'
    """
    return _write_whole(path_for(directory, int(snapshot["rank"])), snapshot)


def write_live(directory: str | os.PathLike[str], live: dict[str, Any]) -> Path:
    """Write a live rank's ``{"rank", "pid", "host", "started", ...}`` next to its trace file.

    Examples:
        >>> import tempfile
        >>> write_live(tempfile.mkdtemp(), {"rank": 1, "pid": 42}).name
        'commlib_live_rank1.json'
    """
    return _write_whole(Path(directory) / f"{_LIVE}{int(live['rank'])}.json", live)


def read_live(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The live ranks' files in ``directory``, by rank (unreadable ones left out).

    Examples:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = write_live(d, {"rank": 0, "pid": 42})
        >>> read_live(d)
        [{'rank': 0, 'pid': 42}]
    """
    found = []
    for path in Path(directory).glob(f"{_LIVE}*.json"):
        try:
            data = json.loads(path.read_text())
            int(data["rank"]), int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.append(data)
    return sorted(found, key=lambda d: int(d["rank"]))


def _write_whole(target: Path, snapshot: dict[str, Any]) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name, suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(snapshot, f, indent=1)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep the files from whoever diagnoses
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_all(directory: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every rank's snapshot in ``directory`` (by rank), and the files that could not be read.

    Examples:
        >>> import tempfile
        >>> read_all(tempfile.mkdtemp())
        ([], [])
    """
    snapshots, problems = [], []
    for path in sorted(Path(directory).glob(f"{_PREFIX}*.json")):
        try:
            data = _checked(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"{path.name}: {exc or type(exc).__name__}")
            continue
        snapshots.append(data)
    snapshots.sort(key=lambda d: int(d["rank"]))
    return snapshots, problems


# what the diagnosis reads of every entry, and of what type
_ENTRY_FIELDS = {"seq": int, "name": str, "state": str, "group": str}


def _checked(data: Any) -> dict[str, Any]:
    """``data`` if it is a snapshot the diagnosis can read; ``ValueError`` saying why not."""
    if not isinstance(data, dict):
        raise ValueError(f"not a {FORMAT} file (a JSON {type(data).__name__})")
    if data.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} file (format {data.get('format')!r})")
    int(data["rank"])
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise ValueError(f"its entries are not a list ({type(entries).__name__})")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"entry {i} is not an object")
        for field, kind in _ENTRY_FIELDS.items():
            if not isinstance(entry.get(field), kind) or isinstance(entry.get(field), bool):
                raise ValueError(f"entry {i} has no {kind.__name__} {field!r}")
    if not isinstance(data.get("run"), (str, type(None))):
        raise ValueError("its run is not a string")
    if not isinstance(data.get("groups", {}), dict):
        raise ValueError("its groups are not an object")
    stacks = data.get("stacks")
    if stacks is not None and not (
        isinstance(stacks, dict) and isinstance(stacks.get("threads", []), list)
    ):
        raise ValueError("its stacks are not an object with a list of threads")
    return data
