"""The slot rounds of ranks on one machine, through shared memory.

Every protocol's first round (the argument check's, all_gather's, the object
collectives') gathers one slot of the same size from every rank
(:mod:`commlib._check_round`). Where every rank of a group runs on this
machine, that round need not go through the engine's sockets: each rank
writes its rows into its area of one shared-memory segment, publishes the
round's number, and copies out every rank's rows once all have published.
On gloo at 2 ranks that costs a few microseconds where the engine's round
costs a hundred or more, and it is the round every checked call pays: a
checked broadcast then costs about what the broadcast does.

The segment holds two generations of areas, taken in turn: a rank writes
round ``k + 2`` where round ``k`` was, and it gets there only once every
rank has published round ``k + 1``, which each does only after copying out
round ``k``. So no rank's rows are overwritten while another still reads
them, with no second wait.

Set up once per process group, at its first slot round (every rank's first
slot round is the same round, whatever protocol it belongs to; a group made
by ``new_group`` or ``split`` sets it up as it is made): rank 0 creates the
segment; in one engine round of a fixed size every rank says whether it is
willing (``COMMLIB_SHARED_ROUNDS=0`` turns it off; x86-64 only, see below),
which machine and network namespace it runs in and how to check on its
process, rank 0 where the segment is; the others map it and check its
nonce, and one more engine round tells every rank that all did. Otherwise
(ranks on several machines or in several network namespaces, no
``/dev/shm``, a rank unwilling) every rank keeps the engine's rounds. The
file is unlinked once every rank mapped it; a rank 0 killed between
creating and unlinking leaves it behind, so the next rank 0 that sets up a
segment on this machine removes those whose creator's process has ended
(:func:`sweep_stale`).
Rounds whose rows do not fit a rank's area (slots larger than the slot ever
learns) take the engine's round, alike on every rank (all ranks use the same
slot size).

Only the bytes a rank wrote are copied, in and out: each rank says how many
in a word of its own per generation, so a large slot costs nothing where
little of it is used, and a call's data (up to :data:`DATA_ROOM`) rides in
it. The argument check's round goes further
(:meth:`SharedRows.heads_lane`, :meth:`SharedRows.data_lane`): its data goes
straight into the area, only the headers come out, and every rank reads the
data where it lies, before its next round.

Waiting spins a moment, then sleeps in the kernel on the first missing
rank's round number until that rank publishes (a futex, :mod:`commlib._futex`:
woken at once, as a socket wait is); without futexes it yields the core, then
naps (growing to 1 ms).
A peer whose process has ended is reported as such (every rank's process
record, :func:`commlib._survivors.process_record`), a wait past its limit
times out as the engine's would, and the caller waits in slices, looking
for a failure another rank announced (:mod:`commlib._waiting`).

x86-64 only: a rank publishes its round's number with a plain store after
writing its rows, and x86-64 keeps stores in order; elsewhere that would
need a fence Python cannot issue.
"""

from __future__ import annotations

import datetime
import mmap
import os
import platform
import secrets
import struct
import time
import weakref
from typing import TYPE_CHECKING, Any

import torch

from commlib import _steps, _survivors
from commlib._futex import Futex
from commlib._host_copy import host_copy
from commlib._rooms import HEADER, LEARN_TOTAL
from commlib.types import DirectCall

if TYPE_CHECKING:
    from collections.abc import Callable

    from commlib._engine import Engine
    from commlib._steps import Steps

#: set to "0" to keep every slot round on the engine
ENV = "COMMLIB_SHARED_ROUNDS"
_MAGIC = b"commlib-rows-v1\0"
# what each rank tells the others in the set-up round: magic, willing, nonce, then
# the segment's path (rank 0) and its process record, each with its length
_RECORD = 512
_INTRO = struct.Struct("<16sq?16s")
_SEQ_STRIDE = 8  # int64s between two ranks' round numbers: a cache line each
_ABORT = 4 + 3  # the word that says a rank gave up on the segment (rank 0's line)
_USED = 5  # a rank's line: how many bytes of each row it wrote, per generation
#: what a call's data may take of a rank's area: here a large slot pads nothing, only
#: the bytes written are copied
DATA_ROOM = 4 << 20
_AREA_MIN = DATA_ROOM + 4096  # the room and a slot's header, page aligned
_ONE_COPY_UP_TO = 64 << 10  # rows written short copied out in one copy up to this many bytes
_TOTAL_MAX = 256 << 20  # address space a group's segment may take (touched as used)
# waiting: spins first, yields the core for a while, then naps growing to the last
_SPIN_FOR, _YIELD_FOR, _FIRST_NAP, _LAST_NAP = 30e-6, 0.001, 50e-6, 1e-3
_LOOK = 0.05  # how often a waiting rank checks on its peers' processes
_SHM, _PREFIX = "/dev/shm", "commlib-rows-"
_GAVE_UP = "shared-memory round {}: a rank of the group gave up on it (the group broke)"


#: each process group's segment (None: its rounds stay on the engine)
_by_group: weakref.WeakKeyDictionary[Any, SharedRows | None] = weakref.WeakKeyDictionary()


def _area_for(world: int) -> int:
    """Bytes of one rank's area: the largest slot ``world`` ranks learn, or the rows apart."""
    area = max(LEARN_TOTAL // world + 4096, _AREA_MIN)
    return min(area, _TOTAL_MAX // (2 * world)) // 4096 * 4096


def _data_at(world: int) -> int:
    # magic and nonce, then the ranks' round numbers, then the areas (page aligned)
    return (32 + 8 * _SEQ_STRIDE * (world + 1) + 4095) // 4096 * 4096


def _willing(size: int) -> bool:
    return (
        os.environ.get(ENV, "1") != "0"
        and platform.machine().lower() in ("x86_64", "amd64")
        and os.path.isdir("/dev/shm")
        and _shm_free() >= 2 * size
    )


def _shm_free() -> int:
    # the segment's pages are taken as they are first written, and a write past what
    # /dev/shm holds ends the process (SIGBUS): share only where the whole segment fits
    # twice (a container's /dev/shm may be 64 MiB)
    try:
        found = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return found.f_bavail * found.f_frsize


class SharedRows:
    """One group's segment: two generations of every rank's area, and its round numbers.

    Examples:
        >>> rows = SharedRows.alone()       # a segment of one rank, for a look
        >>> out = torch.empty(8, dtype=torch.uint8)
        >>> rows.lane(8, False).call(out, torch.arange(8, dtype=torch.uint8), None).wait()
        True
        >>> out.tolist()
        [0, 1, 2, 3, 4, 5, 6, 7]
    """

    def __init__(
        self, buffer: mmap.mmap, world: int, rank: int, records: list[str | None]
    ) -> None:
        self.buffer = buffer
        self.world, self.rank = world, rank
        self.area = _area_for(world)
        self.records = records
        whole = torch.frombuffer(buffer, dtype=torch.uint8)
        start = _data_at(world)
        self.generations = whole[start : start + 2 * world * self.area].view(2, world, self.area)
        # the words after magic and nonce, read and written one at a time (a memoryview's
        # item is a Python int in tens of nanoseconds, numpy's a scalar object): rank r's
        # last published round at SEQ + r * STRIDE, then its rows' mode in each
        # generation (one row for all: 0, one for each rank: 1); the abort mark in
        # rank 0's line
        self.words = memoryview(buffer).cast("q")
        self.seq_at = [4 + r * _SEQ_STRIDE for r in range(world)]
        self.mine = self.seq_at[rank]
        self.published = 0
        # sleeping on a peer's round number until it publishes (None: nap instead); holds
        # an export of the mapping: release it before closing the buffer
        self.futex = Futex.over(buffer)
        self._lanes: dict[tuple[int, bool, str], DirectCall | None] = {}

    @classmethod
    def alone(cls) -> SharedRows:
        """A segment of one rank in anonymous memory (docs and tests)."""
        return cls(mmap.mmap(-1, _data_at(1) + 2 * _area_for(1)), 1, 0, [None])

    def lane(self, slot_bytes: int, apart: bool) -> DirectCall | None:
        """The slot round of ``slot_bytes`` rows as a direct call; ``None`` if they do not fit.

        Called as the engine's ``all_gather_slots`` lane is: ``call(output,
        slots[0], options)``, or with ``apart`` ``call(output, slots, [], [],
        options)`` (row ``j`` for rank ``j``). The rows handed in may be the
        first bytes of each slot alone (``slots[0][:used]``, ``slots[:,
        :used]``): only those are copied, in and out (``output`` says the
        slot's size); the rest of every gathered row is left as it was.
        """
        return self._lane(slot_bytes, apart, "rows")

    def heads_lane(self, slot_bytes: int, apart: bool) -> DirectCall | None:
        """:meth:`lane`, copying out each row's first :data:`~commlib._rooms.HEADER` bytes alone.

        For a protocol that reads the rest where the rows lie (:meth:`rows_of`,
        the generation :meth:`generation` says), valid until this rank's next
        round: no rank writes that generation again before then.

        Examples:
            >>> rows = SharedRows.alone()
            >>> out, row = torch.zeros(512, dtype=torch.uint8), torch.ones(512, dtype=torch.uint8)
            >>> rows.heads_lane(512, False).call(out, row, None).wait()
            True
            >>> int(out.sum()), int(rows.rows_of(rows.generation(), False, 512).sum())
            (288, 512)
        """
        return self._lane(slot_bytes, apart, "heads")

    def data_lane(self, slot_bytes: int, apart: bool) -> DirectCall | None:
        """:meth:`heads_lane` for rows in two pieces: ``call(output, head, data, options)``.

        ``head`` (uint8: each row's first bytes, ``(world, n)`` apart) then
        ``data`` (uint8: what follows in the row, ``(world, m)`` apart, one
        for each rank) go straight into this rank's area: the data is not
        first copied into a slot.

        Examples:
            >>> rows = SharedRows.alone()
            >>> out, head = torch.zeros(512, dtype=torch.uint8), torch.ones(64, dtype=torch.uint8)
            >>> lane = rows.data_lane(512, False)
            >>> lane.call(out, head, torch.ones(100, dtype=torch.uint8), None).wait()
            True
            >>> int(rows.rows_of(rows.generation(), False, 512)[0, :200].sum())
            164
        """
        return self._lane(slot_bytes, apart, "data")

    def _lane(self, slot_bytes: int, apart: bool, copies: str) -> DirectCall | None:
        key = (slot_bytes, apart, copies)
        if key in self._lanes:
            return self._lanes[key]
        found = None
        if self.fits(slot_bytes, apart):
            calls: dict[str, tuple[Callable[..., SharedWork], Callable[..., SharedWork]]] = {
                "rows": (self._gather, self._apart),
                "heads": (self._gather_heads, self._apart_heads),
                "data": (self._gather_data, self._gather_data),  # (apart: a head of rows)
            }
            found = DirectCall(calls[copies][apart], None, via="shared")
        self._lanes[key] = found
        return found

    def generation(self) -> int:
        """The generation of this rank's last round (where :meth:`rows_of` finds its rows)."""
        return self.published & 1

    def rows_of(self, generation: int, apart: bool, size: int) -> torch.Tensor:
        """Every rank's row of ``size`` bytes for this rank in ``generation``: ``(world, size)``.

        ``apart``: each rank's row ``j`` for rank ``j`` (this rank's of each),
        else each rank's one row.
        """
        areas = self.generations[generation]
        if apart:
            return areas[:, self.rank * size : (self.rank + 1) * size]
        return areas[:, :size]

    def fits(self, slot_bytes: int, apart: bool) -> bool:
        """Whether a round of ``slot_bytes`` rows (one for each rank, ``apart``) fits an area.

        Examples:
            >>> rows = SharedRows.alone()
            >>> rows.fits(4096, apart=False), rows.fits(rows.area + 1, apart=False)
            (True, False)
        """
        return slot_bytes * (self.world if apart else 1) <= self.area

    def _round(
        self, output: torch.Tensor, rows: torch.Tensor, apart: bool, heads_only: bool
    ) -> SharedWork:
        # the lanes below, in the engine's call shapes: one row for all or rows apart,
        # every row copied out as used or the headers alone
        size = output.numel() // self.world
        upto = HEADER if heads_only else size
        return SharedWork(self, self.post(rows, apart, size), output, size, apart, upto)

    def _gather(self, output: torch.Tensor, row: torch.Tensor, _options: Any) -> SharedWork:
        return self._round(output, row, False, False)

    def _apart(
        self, output: torch.Tensor, rows: torch.Tensor, _a: Any, _b: Any, _options: Any
    ) -> SharedWork:
        return self._round(output, rows, True, False)

    def _gather_heads(self, output: torch.Tensor, row: torch.Tensor, _options: Any) -> SharedWork:
        return self._round(output, row, False, True)

    def _apart_heads(
        self, output: torch.Tensor, rows: torch.Tensor, _a: Any, _b: Any, _options: Any
    ) -> SharedWork:
        return self._round(output, rows, True, True)

    def _gather_data(
        self, output: torch.Tensor, head: torch.Tensor, data: torch.Tensor, _options: Any
    ) -> SharedWork:
        size = output.numel() // self.world
        apart = head.dim() == 2
        k = self.post_data(head, data, apart, size)
        return SharedWork(self, k, output, size, apart, HEADER)

    def post_data(self, head: torch.Tensor, data: torch.Tensor, apart: bool, size: int) -> int:
        """:meth:`post` of rows made of ``head`` and then ``data`` (:meth:`data_lane`).

        ``data`` may already be where it goes (written there through
        :meth:`next_rows`): then only the head is copied.
        """
        self.published = k = self.published + 1
        area = self.generations[k & 1, self.rank]
        at, n = head.shape[-1], data.shape[-1]
        if apart:
            rows = area[: self.world * size].view(self.world, size)
            rows[:, :at].copy_(head)
            there = rows[:, at : at + n]
        else:
            area[:at].copy_(head)
            there = area[at : at + n]
        if there.data_ptr() != data.data_ptr():
            host_copy(there, data)
        self._publish(k, at + n, apart)
        return k

    def next_rows(self, generation: int, apart: bool, size: int) -> torch.Tensor:
        """This rank's rows of ``size`` bytes in its area of ``generation``: ``(world, size)``
        apart, else ``(1, size)``; a protocol may write its next round's data there itself
        (safe from one round to the next: no rank reads it any more, :meth:`post`).

        Examples:
            >>> SharedRows.alone().next_rows(1, False, 64).shape
            torch.Size([1, 64])
        """
        area = self.generations[generation, self.rank]
        rows = self.world if apart else 1
        return area[: rows * size].view(rows, size)

    def post(self, rows: torch.Tensor, apart: bool, size: int | None = None) -> int:
        """Write this rank's ``rows`` into its area of the next generation; publish the round.

        ``apart``: row ``j`` is for rank ``j`` (``(world, used)``), laid ``size``
        bytes apart (the slot's size; ``used`` when ``None``); otherwise one
        row for every rank, of which ``rows`` are the bytes used.
        """
        self.published = k = self.published + 1
        area = self.generations[k & 1, self.rank]
        if apart:
            used = rows.shape[-1]
            size = used if size is None else size
            host_copy(area[: len(rows) * size].view(len(rows), size)[:, :used], rows)
        else:
            used = rows.numel()
            host_copy(area[:used], rows.reshape(-1))
        self._publish(k, used, apart)
        return k

    def _publish(self, k: int, used: int, apart: bool) -> None:
        mine, gen = self.mine, k & 1
        words = self.words
        words[mine + _USED + gen] = used
        words[mine + 1 + gen] = apart
        words[mine] = k  # after the rows: x86-64 keeps the stores in order
        if self.futex is not None:  # always: a flag read after the store needs a fence
            self.futex.wake(8 * mine)

    def abort(self) -> None:
        """Mark the segment given up (the group broke here): no round completes on it any more.

        A rank that arrives late at a round the others abandoned would
        otherwise find every rank's rows published and complete it alone.
        """
        self.words[_ABORT] = 1

    def aborted(self) -> bool:
        """Whether a rank of the group gave up on it (:meth:`abort`)."""
        return self.words[_ABORT] != 0

    def arrived(self, k: int) -> bool:
        """Whether every rank has published round ``k``."""
        words = self.words
        for at in self.seq_at:
            if words[at] < k:
                return False
        return True

    def copy_out(
        self, k: int, output: torch.Tensor, size: int, apart: bool, upto: int | None = None
    ) -> None:
        """Every rank's row of round ``k`` for this rank, in rank order, into ``output``.

        Only the bytes the ranks wrote (:meth:`post`: each rank's, or in a
        small round the longest's from every rank, in one copy), and of those
        the first ``upto``; the rest of the rows in ``output`` is left as it was.
        """
        areas = self.generations[k & 1]
        mine = self.rank * size
        words, gen = self.words, k & 1
        modes = [words[at + 1 + gen] for at in self.seq_at]
        upto = size if upto is None else min(upto, size)
        useds = [min(words[at + _USED + gen], upto) for at in self.seq_at]
        out = output.view(self.world, size)
        if modes.count(apart) == self.world:  # every rank sent as this one
            most = max(useds)
            if min(useds) == most or most * self.world <= _ONE_COPY_UP_TO:
                # one copy (a rank's bytes past what it wrote are its own old ones: no
                # rank writes this generation again before this rank's next round)
                host_copy(
                    out[:, :most], areas[:, mine : mine + most] if apart else areas[:, :most]
                )
                return
            for r, used in enumerate(useds):  # a root's data and the others' headers
                at = mine if apart else 0
                host_copy(out[r, :used], areas[r, at : at + used])
            return
        # a rank in another protocol's round (its rows apart or not): what the engine
        # would have delivered from each, so every rank sees the others' headers
        for r, its in enumerate(modes):
            used = useds[r]
            host_copy(out[r, :used], areas[r, mine : mine + used] if its else areas[r, :used])

    def wait_for(self, k: int, timeout: datetime.timedelta | None) -> None:
        """Return once every rank published round ``k``; ``RuntimeError`` past ``timeout``."""
        arrived = self.arrived
        start = time.monotonic()
        spin_until = start + _SPIN_FOR
        while time.monotonic() < spin_until:  # a peer a few microseconds away
            if arrived(k):
                return
        deadline = None if timeout is None else start + timeout.total_seconds()
        look, nap = start + _LOOK, _FIRST_NAP
        while not arrived(k):
            now = time.monotonic()
            if self.futex is not None:
                # until the first missing rank publishes, or a look or the deadline is due
                until = look if deadline is None else min(look, deadline)
                if until > now:
                    self._sleep_on_missing(k, until - now)
            elif now - start < _YIELD_FOR:
                os.sched_yield()
            else:
                time.sleep(nap)
                nap = min(2 * nap, _LAST_NAP)
            if now >= look:
                self._look_at_peers(k)
                look = now + _LOOK
            if deadline is not None and now >= deadline:
                missing = [r for r, at in enumerate(self.seq_at) if self.words[at] < k]
                # torch's Work says this when a wait's time ran out (commlib._waiting)
                raise RuntimeError(
                    f"Operation timed out: shared-memory round {k} waits for ranks {missing}"
                )

    def _sleep_on_missing(self, k: int, seconds: float) -> None:
        words, futex = self.words, self.futex
        assert futex is not None
        for at in self.seq_at:
            seen = words[at]
            if seen < k:
                # its round number's low half (little-endian: at the int64's address); a
                # publish since the read returns at once
                if not futex.wait(8 * at, seen, seconds):
                    self.futex = None  # the kernel refused: nap from now on
                return

    def _look_at_peers(self, k: int) -> None:
        if self.aborted():
            raise RuntimeError(_GAVE_UP.format(k))
        for r, record in enumerate(self.records):
            if (
                r != self.rank
                and record
                and self.words[self.seq_at[r]] < k
                and _survivors.record_ended(record)
            ):
                raise RuntimeError(
                    f"rank {r} ended its process before shared-memory round {k} (its record: "
                    f"{record})"
                )


class SharedWork:
    """One rank's part in a shared-memory round: posted already; ``wait`` copies the rows out.

    Examples:
        >>> rows = SharedRows.alone()
        >>> out = torch.empty(4, dtype=torch.uint8)
        >>> work = rows.lane(4, False).call(out, torch.ones(4, dtype=torch.uint8), None)
        >>> work.is_completed(), out.tolist()
        (True, [1, 1, 1, 1])
    """

    # its wait only waits (commlib._waiting takes it in slices)
    interruptible = True
    __slots__ = ("apart", "done", "k", "output", "rows", "size", "upto")

    def __init__(
        self, rows: SharedRows, k: int, output: torch.Tensor, size: int, apart: bool, upto: int
    ) -> None:
        self.rows, self.k, self.output, self.size, self.apart = rows, k, output, size, apart
        self.upto = upto  # the bytes of each row copied out (the rest is read where it lies)
        self.done = False

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Wait for every rank's rows (at most ``timeout``), then copy them out."""
        if not self.done:
            rows = self.rows
            if not rows.arrived(self.k):
                rows.wait_for(self.k, timeout)
            if rows.aborted():
                raise RuntimeError(_GAVE_UP.format(self.k))
            rows.copy_out(self.k, self.output, self.size, self.apart, self.upto)
            self.done = True
        return True

    def is_completed(self) -> bool:
        """Whether every rank's rows are here (copied out as it says so)."""
        if not self.done and self.rows.arrived(self.k):
            self.wait()
        return self.done


def shared_rows(
    engine: Engine, what: str, timeout: datetime.timedelta | None = None
) -> SharedRows | None:
    """The engine's segment, set up at its first slot round (two engine rounds); ``None``: none.

    Call it where every rank issues a slot round (a protocol's first
    round), before choosing the round's lane; later, ``engine.kept["shared"]``
    holds the answer. A protocol written as steps sets it up with
    :func:`set_up_steps` (an async call's rounds run later).

    Examples:
        >>> shared_rows(commlib.Communicator()._engine, "all_reduce") is None   # single
        True
    """
    kept = engine.kept
    if "shared" in kept:
        found: SharedRows | None = kept["shared"]
        return found
    return _steps.run(engine, set_up_steps(engine, what), timeout)


def set_up_steps(engine: Engine, what: str) -> Steps[SharedRows | None]:
    """:func:`shared_rows` as steps: the set-up's engine rounds yielded, as a protocol's are.

    Examples:
        >>> _steps.run(engine, set_up_steps(engine, "all_gather_object")) is None  # single
        True
    """
    kept = engine.kept
    if "shared" in kept:
        found: SharedRows | None = kept["shared"]
        return found
    found = None
    group = engine.group
    if (
        engine.on_cpu
        and engine.world_size > 1
        and group is not None
        and getattr(engine.plugin, "shares_host_rounds", False)
    ):
        # one per process group: every communicator of the group takes the same rounds
        if group in _by_group:
            found = _by_group[group]
        else:
            found = yield from _set_up(engine, what)
            _by_group[group] = found
    kept["shared"] = found
    return found


def _set_up(engine: Engine, what: str) -> Steps[SharedRows | None]:
    world, rank = engine.world_size, engine.rank
    size = _data_at(world) + 2 * world * _area_for(world)
    if rank == 0:
        sweep_stale()  # before the room is measured: what it frees counts
    willing = _willing(size)
    nonce, path = secrets.token_bytes(16), ""
    buffer: mmap.mmap | None = None
    try:
        if rank == 0 and willing:
            try:
                path = f"{_SHM}/{_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
                buffer = _create(path, size, nonce)
            except OSError:
                willing, path = False, ""
        record = _survivors.process_record() or ""
        mine = _intro(rank, willing, nonce, path, record, _machine())
        intros = yield from _exchange(engine, what, mine, _RECORD)
        told = [_read_intro(intros[r], r) for r in range(world)]
        ok = all(t[0] for t in told) and len({t[4] for t in told}) == 1
        if ok and rank != 0:
            buffer = _attach(told[0][2], size, told[0][1])
            ok = buffer is not None
        oks = yield from _exchange(engine, what, bytes([ok]) + bytes(15), 16)
        if not all(o[0] == 1 for o in oks) or buffer is None:
            return None
        found = SharedRows(buffer, world, rank, [t[3] or None for t in told])
        buffer = None  # the segment's now
        return found
    finally:
        if buffer is not None:
            buffer.close()
        if path:
            _unlink(path)


def sweep_stale(where: str | None = None) -> list[str]:
    """Remove the segments left by a rank 0 whose process has ended; their names.

    A segment's name carries its creator's pid. A process that cannot be
    signalled for lack of permission is alive; a pid reused since, or one of
    another pid namespace sharing this ``/dev/shm``, keeps or loses a file that
    is either stale or still in its creator's set-up: there, a rank that cannot
    map it makes the group keep the engine's rounds, which every rank agrees on.

    Examples:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> open(f"{d}/commlib-rows-{2**22 + 1}-abc", "w").close()  # past pid_max
        >>> open(f"{d}/commlib-rows-{os.getpid()}-abc", "w").close()
        >>> [os.path.basename(p) for p in sweep_stale(d)]
        ['commlib-rows-4194305-abc']
    """
    where = _SHM if where is None else where
    removed: list[str] = []
    try:
        names = os.listdir(where)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(_PREFIX):
            continue
        pid = name[len(_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        _unlink(os.path.join(where, name))
        removed.append(os.path.join(where, name))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _create(path: str, size: int, nonce: bytes) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        buffer = mmap.mmap(fd, size)
    except OSError:
        os.close(fd)
        _unlink(path)
        raise
    os.close(fd)
    buffer[:32] = _MAGIC + nonce
    return buffer


def _attach(path: str, size: int, nonce: bytes) -> mmap.mmap | None:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None  # another machine's /dev/shm, or none
    try:
        if os.fstat(fd).st_size != size:
            return None
        buffer = mmap.mmap(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)
    if buffer[:32] != _MAGIC + nonce:
        buffer.close()
        return None
    return buffer


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # gone already


def _machine() -> str:
    """This machine and network namespace: ranks that share it may share memory.

    Ranks in other network namespaces are taken as other hosts even where they
    could map the file (the tests' simulated hosts; containers usually have
    their own ``/dev/shm`` too).
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot} net:{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:
        return f"unknown {os.getpid()}"  # no telling: share with nobody


def _intro(rank: int, willing: bool, nonce: bytes, path: str, record: str, machine: str) -> bytes:
    tail = b""
    for text in (path, record, machine):
        raw = text.encode()[:200]
        tail += struct.pack("<H", len(raw)) + raw
    return (_INTRO.pack(_MAGIC, rank, willing, nonce) + tail).ljust(_RECORD, b"\0")


def _read_intro(raw: bytes, rank: int) -> tuple[bool, bytes, str, str, str]:
    magic, said, willing, nonce = _INTRO.unpack_from(raw)
    if magic != _MAGIC or said != rank:
        # another protocol's round, or a group that is not what it says (a fake one,
        # which hands every rank this rank's bytes): nobody shares
        return False, b"", "", "", f"stranger {rank}"
    pos, texts = _INTRO.size, []
    for _ in range(3):
        (n,) = struct.unpack_from("<H", raw, pos)
        texts.append(bytes(raw[pos + 2 : pos + 2 + n]).decode(errors="replace"))
        pos += 2 + n
    return willing, nonce, texts[0], texts[1], texts[2]


def _exchange(engine: Engine, what: str, mine: bytes, size: int) -> Steps[list[bytes]]:
    """Every rank's ``mine`` (``size`` bytes on every rank) through one engine all_gather."""
    every = torch.zeros(engine.world_size * size, dtype=torch.uint8)
    sent = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
    yield from _steps.call(engine, what, "all_gather_into_tensor", every, sent)
    raw = every.numpy().tobytes()
    return [raw[r * size : (r + 1) * size] for r in range(engine.world_size)]
