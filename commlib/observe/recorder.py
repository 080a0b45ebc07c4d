"""The flight recorder: each rank's bounded record of its recent collectives.

A built-in observer on the same hooks third-party observers use. It keeps the
last ``capacity`` collectives (sequence number, collective, shapes, dtypes,
src/dst, group, start and end times, state, error) and writes them as one file
per rank (:mod:`commlib.observe.trace_files`) when asked: by
:mod:`commlib.observe.alarm` when a collective fails here or on another rank,
on ``SIGUSR1``, and at exit. ``commlib trace DIR`` reads the files.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import torch.distributed as dist

from commlib._world import default_store
from commlib.errors import CommError, NonFiniteError, RemoteArgumentError
from commlib.hookspecs import hookimpl
from commlib.observe import stacks as threads_stacks
from commlib.observe import trace_files
from commlib.observe._lines import shorten
from commlib.observe.event import CollectiveEvent

DEFAULT_CAPACITY = 2000
_ERROR_CHARS = 500  # enough to name the ranks; a whole traceback would swamp the file


# a record's start, as the start hook keeps it: the recorder's number for it, the
# facts every call of its collective on its communicator with its payload's shape
# and dtype shares (one tuple the dispatcher made once, see _FACTS: the ring must
# not keep communicators alive, and shares this tuple rather than copying it), then
# the call's own: seq, peers, op, point_to_point, start, call_site. Its end, as the
# end hook keeps it: the duration alone for a completed collective (a float: no
# tuple to make), else (duration, state, error). The dump makes the trace file's dicts.
_FACTS = ("name", "group", "group_ranks", "rank", "uniform", "shapes", "dtypes", "nbytes")


def _facts_of(event: CollectiveEvent) -> tuple[Any, ...]:
    """The facts of ``event`` the dispatcher shares (``_FACTS``), made here for another event."""
    return tuple([getattr(event, name) for name in _FACTS])


def as_entry(started: tuple[Any, ...], ended: Any) -> dict[str, Any]:
    """A record as the trace file stores it: ``started`` as the start hook kept it,
    ``ended`` as the end hook did (``None``: still running).

    Examples:
        >>> facts = ("barrier", "world", (0,), 0, False, (), (), 0)
        >>> started = (1, facts, 3, {}, None, False, 5.0, None)
        >>> entry = as_entry(started, 0.5)
        >>> entry["name"], entry["seq"], entry["end"], entry["state"], entry["call_site"]
        ('barrier', 3, 5.5, 'completed', None)
        >>> as_entry(started, None)["state"], as_entry(started, (1.0, "failed", "E: x"))["error"]
        ('started', 'E: x')
    """
    _, facts, seq, peers, op, point_to_point, start, site = started
    name, group, _, rank, uniform, shapes, dtypes, nbytes = facts
    if ended is None:
        end, state, error = None, "started", None
    elif type(ended) is tuple:
        duration, state, error = ended
        end = start + (duration or 0.0)
    else:
        end, state, error = start + (ended or 0.0), "completed", None
    return {
        "group": group,
        "seq": seq,
        "name": name,
        "rank": rank,
        "shapes": [list(s) for s in shapes],
        "dtypes": list(dtypes),
        "nbytes": nbytes,
        "peers": dict(peers),
        "op": op,
        "uniform": uniform,
        "point_to_point": point_to_point,
        "start": start,
        "end": end,
        "state": state,
        "error": error,
        "call_site": None if site is None else site.as_dict(),
    }


class FlightRecorder:
    """Keep this process's last ``capacity`` collectives; write them to ``directory``.

    Register it like any observer (``commlib.observe.enable_flight_recorder``
    does, and ``COMMLIB_TRACE_DIR`` at start-up). Without a directory it only
    keeps records (:meth:`snapshot`).

    Args:
        capacity: how many collectives to keep (the oldest go first).
        directory: where :meth:`dump` writes, one file per rank.

    Examples:
        >>> from commlib.observe import FlightRecorder
        >>> from commlib.plugins import plugin_manager
        >>> recorder = FlightRecorder(capacity=100)
        >>> _ = plugin_manager().register(recorder)
        >>> comm.all_reduce(torch.ones(2))
        >>> [(e["name"], e["state"]) for e in recorder.snapshot()["entries"]][-1]
        ('all_reduce', 'completed')
        >>> _ = plugin_manager().unregister(recorder)
    """

    #: the dispatcher fills in each event's call site for the recorder
    commlib_call_sites = True
    #: ... and each event's payload facts (shapes, dtypes, bytes) made at its start
    commlib_reads_payload = True

    # what the hooks read and write on every collective are slots: reads and
    # writes of an instance's __dict__ attributes take CPython's generic path
    # once that dict is made (pluggy's registration looks the plugin over),
    # hundreds of instructions each; the rest stays in __dict__
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_ended",
        "_groups",
        "_last",
        "_last_number",
        "_last_slot",
        "_open",
        "_rank",
        "_started",
        "capacity",
        "on_failure",
        "recorded",
    )

    def __init__(
        self, capacity: int = DEFAULT_CAPACITY, directory: str | os.PathLike[str] | None = None
    ):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        # absolute now: a program that changes its working directory later (hydra
        # does, per run) would write somewhere else at its failure or exit
        self.directory = Path(directory).absolute() if directory else None
        self.recorded = 0
        # the ring, made once: record n (from 1) is kept at n % capacity, its
        # start (a tuple, see _FACTS) in _started and its end in _ended, both
        # written over once the ring is full: a tuple a collective, no dict, and
        # the trace file's dicts made only when it is written
        self._started: list[tuple[Any, ...] | None] = [None] * capacity
        self._ended: list[Any] = [None] * capacity  # see _FACTS
        # the collective started last, until it ends: the event (held no longer
        # than its call, unless nobody waits on its handle: then until the next
        # start), its number and its slot (most end before the next starts, and
        # need neither a dictionary nor an id())
        self._last: CollectiveEvent | None = None
        self._last_number = 0
        self._last_slot = 0
        self._open: dict[int, int] = {}  # the others still open: id(event) -> number
        self._groups: dict[str, list[int]] = {}
        self._rank: int | None = None
        self._reasons: deque[str] = deque(maxlen=20)  # why the file was written, oldest first
        self._world_size = 1
        self._run: str | None = None  # the id every rank of this run shares (trace files)
        self._stacks: dict[str, Any] | None = None  # the threads' stacks last taken
        self._lock = threading.Lock()
        #: called with a reason when a collective failed here (set by commlib.observe.alarm)
        self.on_failure: Any = None

    # -- the hooks ---------------------------------------------------------------------
    @hookimpl
    def commlib_collective_start(self, event: CollectiveEvent) -> None:
        """Keep a record of ``event`` (the oldest record goes when full)."""
        number = self.recorded + 1
        slot = number % self.capacity
        try:
            # the dispatcher's shared facts (commlib.observe.dispatch._Live), made at
            # the start for us (commlib_reads_payload): one read, not eight
            facts = event._facts  # type: ignore[attr-defined]
        except AttributeError:  # an event made elsewhere (a test's, say)
            facts = None
        if facts is None:
            facts = _facts_of(event)
        # the end first: a dump between the two lines sees the new start still running
        self._ended[slot] = None
        self._started[slot] = (
            number,
            facts,
            event.seq,
            event.peers,
            event.op,
            event.point_to_point,
            event.start,
            event.call_site,
        )
        self.recorded = number  # after the slot is filled: snapshot() reads the ring by it
        if self._last is not None:  # still open (an async handle, another thread's)
            if len(self._open) >= self.capacity:  # handles nobody waits on must not pile up
                self._open.pop(next(iter(self._open)))
            self._open[id(self._last)] = self._last_number
        self._last = event
        self._last_number = number
        self._last_slot = slot
        if self._rank is None:
            self._learn_rank(event)

    @hookimpl
    def commlib_collective_end(self, event: CollectiveEvent) -> None:
        """Complete the record; a failure writes the file (and tells the other ranks)."""
        if event is self._last:  # nothing started since: its slot holds it still
            slot = self._last_slot
            self._last = None
        else:
            number = self._open.pop(id(event), None)
            if number is None:
                return
            slot = number % self.capacity
            started = self._started[slot]
            if started is None or started[0] != number:
                return  # its slot holds a later collective now: it left the ring
        error = event.error
        if error is None:
            state = event.state
            # a completed collective's end is its duration alone (see _FACTS)
            self._ended[slot] = (
                event.duration if state == "completed" else (event.duration, state, None)
            )
            return
        text = f"{type(error).__name__}: {error}"
        self._ended[slot] = (event.duration, event.state, text[:_ERROR_CHARS])
        # arguments refused on every rank explain themselves: no file, nothing
        # to tell the others
        if self.on_failure is not None and not _refused(error):
            self.on_failure(
                f"{event.name} #{event.seq} {event.state} on rank {self.rank} "
                f"(group {event.group}): {shorten(text, 200)}"
            )

    def _learn_rank(self, event: CollectiveEvent) -> None:
        if dist.is_available() and dist.is_initialized():
            self._learn_world()
        else:
            self._rank = event.group_ranks[event.rank]
            self._world_size = len(event.group_ranks)

    def _learn_world(self) -> None:
        """Rank, world size and run id, from torch.distributed (once, whichever asks first)."""
        self._rank, self._world_size = dist.get_rank(), dist.get_world_size()
        self._run = _run_id()

    # -- reading -----------------------------------------------------------------------
    def identity(self) -> tuple[int, int]:
        """This process's world rank and the world size.

        Learnt from torch.distributed (or the first collective); ``RANK`` and
        ``WORLD_SIZE`` until then.

        Examples:
            >>> FlightRecorder().identity()
            (0, 1)
        """
        if self._rank is None and dist.is_available() and dist.is_initialized():
            self._learn_world()
        if self._rank is None:
            return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        return self._rank, self._world_size

    @property
    def rank(self) -> int:
        """This process's world rank (see :meth:`identity`)."""
        return self.identity()[0]

    def snapshot(self, reason: str = "") -> dict[str, Any]:
        """The records as the trace file stores them, oldest first.

        Examples:
            >>> FlightRecorder().snapshot("asked")["reason"]
            'asked'
        """
        rank, world = self.identity()
        # oldest first: the slot the next collective fills, onwards (another
        # thread may dump while this one records: slicing a list is atomic)
        cut = (self.recorded + 1) % self.capacity
        started = self._started[cut:] + self._started[:cut]
        ended = self._ended[cut:] + self._ended[:cut]
        entries = [as_entry(s, e) for s, e in zip(started, ended) if s is not None]
        groups = self._groups
        for s in started:  # the groups of the records kept (and of those written before)
            if s is not None and s[1][1] not in groups:
                groups[s[1][1]] = list(s[1][2])
        return {
            "format": trace_files.FORMAT,
            "rank": rank,
            "world_size": world,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run": self._run,
            "written": time.time(),
            "reason": reason,
            "reasons": [*self._reasons, reason] if reason else list(self._reasons),
            "capacity": self.capacity,
            "recorded": self.recorded,
            "groups": dict(self._groups),
            "entries": entries,
            "stacks": self._stacks,
        }

    def dump(
        self, reason: str, directory: str | Path | None = None, *, stacks: bool = True
    ) -> Path | None:
        """Write this rank's file into ``directory`` (the recorder's by default).

        With ``stacks``, every thread's Python stack is taken now and written
        with the records (:mod:`commlib.observe.stacks`); the last ones taken
        stay in the files written after (the one at exit takes none).
        Returns the file, or ``None`` when there is no directory.

        Examples:
            >>> import tempfile
            >>> FlightRecorder().dump("asked", tempfile.mkdtemp()).name
            'commlib_trace_rank0.json'
        """
        target = directory or self.directory
        if target is None:
            return None
        with self._lock:  # the main thread and the watcher may both be asked
            if stacks:
                self._stacks = threads_stacks.capture(reason)
            written = trace_files.write(target, self.snapshot(reason))
            self._reasons.append(reason)
            return written


def _refused(error: BaseException) -> bool:
    """Whether ``error`` is arguments refused on every rank (each rank's own, or one's).

    Ranks whose collectives or arguments disagree are a divergence, which the
    others' records help explain; a refused argument explains itself.
    """
    if isinstance(error, RemoteArgumentError):
        return error.refused
    if isinstance(error, NonFiniteError):
        return True  # every rank names the ranks and the line: it explains itself
    return isinstance(error, (ValueError, TypeError)) and not isinstance(error, CommError)


_RUN_KEY = "commlib/trace_run"


def _run_id() -> str | None:
    """An id every rank of this run shares and the next run does not; ``None`` if unknown.

    The first rank to ask puts a new one in the run's store; the others read it.
    Trace files of an earlier run left in the same directory are told apart by it.
    """
    store = default_store()
    if store is None:  # no store to ask: files carry no id
        return None
    try:
        return store.compare_set(_RUN_KEY, "", uuid.uuid4().hex).decode()
    except Exception:  # a custom store, or it is gone: files carry no id
        return None
