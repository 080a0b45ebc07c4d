"""The argument check before a tensor collective, folded into its first round.

gloo ends the whole process when ranks call the same collective with
different byte counts (``gloo::EnforceNotMet`` is thrown on gloo's own I/O
thread, where no caller can catch it), and other mismatches give wrong
results or hang. So before a checked collective every rank contributes one
slot to one all_gather, the same number of bytes on every rank: the
communicator's ``slot_size``, or more where the last calls' data needed more
(:mod:`commlib._rooms`, shared with ``all_gather``'s first round):

* a header: a fingerprint of what the rank passes (collective, op, dtype,
  shape, src/dst), its byte count, and whether its data follows;
* when the data fits the rest of the slot, the data itself.

Every rank sends the same number of bytes whatever it passed, so this round
cannot abort. If the headers differ, every rank raises the same
:class:`~commlib.errors.RemoteArgumentError` showing what each rank passed
(one more round, on that path only). If they agree and the data came along,
the collective completes from the gathered slots on every rank alike (a
reduction in rank order, a copy of ``src``'s slot, ...): a small collective
costs one round, as it would unchecked. Larger data follows in the engine's
own collective, after the check: one small round more, until the slot has
learnt their size. The slot learns sizes up to its cap from the collectives
where every rank needs every rank's data (``all_reduce``,
``all_gather_into_tensor``), and only up to ``_rooms.PAD_UP_TO`` (128 KiB)
from the others: a broadcast or reduce carried in a large slot would send
every rank's padding to every rank, more than the second round costs.

Where the group's rounds go through shared memory (:mod:`commlib._shared_rows`)
a large slot pads nothing: each rank copies in only what it wrote, data a
call copies goes straight into the segment (:data:`DIRECT_FROM`), only the
headers come out, and every rank's data is read where it lies. There every
call's data teaches the slot up to the segment's room, 4 MiB a rank: a
checked broadcast, all_reduce or all_to_all of up to 4 MiB is one round (the
receivers copy the data once, from the segment into their tensor), where
the engine's collective after a round of headers would wait for the last
rank to arrive before sending anything. The object collectives' first
round copies only its bytes too, so a large slot costs them nothing.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import operator
import struct
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from commlib import _catalog, _lanes, _objects
from commlib._host_copy import PARALLEL_FROM, copy_bytes, host_copy, is_plain_memory, stack_into
from commlib._rooms import HEADER, Rooms, learn_cap, rooms_of, teaches
from commlib._sent_slots import LAYOUTS, Areas, SentSlot
from commlib._shared_rows import SharedRows, shared_rows
from commlib.dtypes import byte_view
from commlib.errors import RemoteArgumentError

# what a rank that refused its own arguments describes them as (Guard.refuse)
REFUSED = "(refused: "
# why the check raises where the ranks' descriptions differ
DIFFERENT = "ranks passed different arguments"
if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Sequence

    from commlib._engine import Engine
    from commlib.backend import DirectCall
    from commlib.serialization import Serializer
#: where a round's gathered rows lie: ``None``, in the host's rows; else in the segment,
#: ``(generation, apart)`` (:meth:`SharedRows.rows_of`)
At = tuple[int, bool] | None
# magic and fingerprint, then byte count and whether the data follows: a slot
# any other protocol's first round would not be mistaken for
_HEAD = struct.Struct("<qq")
_TAIL = struct.Struct("<qq")
_MAGIC = 0x434F4D4D4C494221  # "COMMLIB!"
_HEADER_SIZE = _HEAD.size + _TAIL.size
_DATA = 64  # where the data starts in a slot: aligned for every dtype
#: data of this many bytes or more that a call copies goes straight into the segment
#: (one copy where the slot would take two; below, one copy of the whole row is cheaper)
DIRECT_FROM = 64 << 10


def fingerprint(description: str) -> int:
    """A signed 64-bit digest of ``description``: what a slot's header carries.

    Examples:
        >>> fingerprint("all_reduce float32 (2,)") == fingerprint("all_reduce float32 (2,)")
        True
    """
    digest = hashlib.blake2b(description.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


@functools.lru_cache(maxsize=4096)
def _head(description: str) -> bytes:
    # a hot loop passes the same few descriptions: hash each once
    return _HEAD.pack(_MAGIC, fingerprint(description))


@functools.lru_cache(maxsize=4096)
def _header(description: str, nbytes: int, inline: bool) -> bytes:
    # the whole header of a slot, built once per kind of call
    return _head(description) + _TAIL.pack(nbytes, int(inline))


class HostSlots:
    """One engine's outgoing and gathered slots in host memory, reused call after call.

    Safe to reuse: a caller consumes the gathered data before its next call.
    The views of every rank's data area in the gathered slots, typed and
    shaped like the data, are made once per layout, as the sent slot's are.
    """

    def __init__(
        self,
        world: int,
        slot_size: int,
        apart: bool,
        rooms: Rooms,
        segment: SharedRows | None = None,
    ):
        self.slot_size = slot_size
        #: the group's learnt rooms (one object for the engine's life: :func:`rooms_of`)
        self.rooms = rooms
        #: each kind of call's round, prepared on its first call that agreed (:class:`Round`)
        self.rounds: dict[object, Round] = {}
        #: every row's header, as many as the rows: a steady call compares them in one step
        self.world = world
        #: whether the engine sends row ``j`` to rank ``j`` (``sends_slot_rows_apart``)
        self.apart = apart
        #: the segment the round goes through (shared memory), if any: there each call
        #: sends its rows apart or one for all as it needs, so data for all is written
        #: in one row, and every rank's data is read where it lies (headers come out)
        self.segment = segment
        self.shared = shared = segment is not None
        #: whether data for every rank goes into every row (the engine sends them apart)
        self.spreads = apart and not shared
        # rows apart: one slot per rank; otherwise the engine gathers the first row
        # alone (Backend.all_gather_slots), so the others would be copies never sent
        copies = world if apart else 1
        self.sent = SentSlot(copies, slot_size, _DATA)
        #: the header the sent rows hold now: a loop of one call writes it once
        self.written = b""
        self.first = self.sent.rows[0]  # what an engine that gathers one row sends
        self.every_raw = bytearray(world * slot_size)
        self.every = torch.frombuffer(self.every_raw, dtype=torch.uint8)
        self.rows = self.every.view(world, slot_size)
        self.starts = range(0, world * slot_size, slot_size)  # where each gathered row begins
        #: every gathered row's header, cut out in one call (a tuple; one row: the row's)
        self.heads = operator.itemgetter(*(slice(s, s + _HEADER_SIZE) for s in self.starts))
        self.layouts: dict[tuple[torch.dtype, torch.Size, At], list[torch.Tensor]] = {}
        self.own: dict[tuple[torch.dtype, torch.Size, int, At], list[torch.Tensor]] = {}
        self.upto: dict[tuple[int, bool], torch.Tensor] = {}
        self.nexts: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def sent_upto(self, used: int, apart: bool) -> torch.Tensor:
        """The sent rows' first ``used`` bytes (all rows, or the first), as a shared round
        takes them (its lane's rows)."""
        found = self.upto.get((used, apart))
        if found is None:
            if len(self.upto) >= LAYOUTS:
                self.upto.clear()
            rows = self.sent.rows
            found = self.upto[used, apart] = rows[:, :used] if apart else rows[0, :used]
        return found

    def next_area(
        self, like: torch.Tensor, nbytes: int, apart: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Where a writer puts the next round's data in the segment: this rank's data
        area (apart: of every row) typed and shaped like ``like``, and its bytes."""
        segment = self.segment
        assert segment is not None
        generation = (segment.published + 1) & 1
        key = (like.dtype, like.shape, generation, apart)
        found = self.nexts.get(key)
        if found is None:
            if len(self.nexts) >= LAYOUTS:
                self.nexts.clear()
            rows = segment.next_rows(generation, apart, self.slot_size)
            every = Areas(rows, _DATA, like, nbytes).every
            flat = rows[:, _DATA : _DATA + nbytes]
            found = self.nexts[key] = (every, flat) if apart else (every[0], flat[0])
        return found

    def at(self, apart: bool) -> At:
        """Where the last round's rows lie: ``None`` (in :attr:`rows`), or in the segment."""
        segment = self.segment
        return None if segment is None else (segment.published & 1, apart)

    def rows_at(self, at: At) -> torch.Tensor:
        """Every rank's row for this rank, ``(world, slot_size)``, where ``at`` says."""
        if at is None or self.segment is None:
            return self.rows
        return self.segment.rows_of(at[0], at[1], self.slot_size)

    def gathered(self, data: torch.Tensor, nbytes: int, at: At = None) -> list[torch.Tensor]:
        """Every rank's data area in the gathered slots, typed and shaped like ``data``."""
        key = (data.dtype, data.shape, at)
        found = self.layouts.get(key)
        if found is None:
            if len(self.layouts) >= LAYOUTS:
                self.layouts.clear()
            found = self.layouts[key] = [
                _typed(row.narrow(0, _DATA, nbytes), data) for row in self.rows_at(at).unbind(0)
            ]
        return found

    def own_parts(
        self, data: torch.Tensor, nbytes: int, rank: int, at: At = None
    ) -> list[torch.Tensor]:
        """Part ``rank`` of every rank's ``data`` (``(world, *part)``) in the gathered slots."""
        key = (data.dtype, data.shape, rank, at)
        found = self.own.get(key)
        if found is None:
            if len(self.own) >= LAYOUTS:
                self.own.clear()
            found = self.own[key] = [every[rank] for every in self.gathered(data, nbytes, at)]
        return found


def _typed(area: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return area.view(like.dtype).view(like.shape)


def _block(
    host: HostSlots, like: torch.Tensor, nbytes: int, own: int | None, at: At = None
) -> torch.Tensor:
    # every rank's data area as one strided tensor, (world, *like.shape); ``own``: of
    # each rank's parts (``like`` is (world, *part)), the one for rank ``own``
    areas = host.rows_at(at).narrow(1, _DATA, nbytes).view(like.dtype)
    block = areas.view(host.world, *like.shape)
    return block if own is None else block[:, own]


def _rows_apart(engine: Engine, slot_size: int) -> bool:
    # whether the round of ``slot_size`` rows sends row j to rank j: a shared round
    # that fits does, whatever the engine would
    shared: SharedRows | None = engine.kept.get("shared")
    if shared is not None and shared.fits(slot_size, True):
        return True
    return engine.sends_slot_rows_apart(slot_size)


def _slots(engine: Engine, slot_size: int, rooms: Rooms) -> HostSlots:
    slots: HostSlots | None = engine.kept.get("check")
    if slots is None or slots.slot_size != slot_size:
        world = engine.world_size
        apart = _rows_apart(engine, slot_size)
        shared: SharedRows | None = engine.kept.get("shared")
        # (its lane for one row for all, and for rows apart where they go apart)
        if shared is not None and not shared.fits(slot_size, apart):
            shared = None
        slots = engine.kept["check"] = HostSlots(world, slot_size, apart, rooms, shared)
    return slots


class Round:
    """One kind of call's round on the host, prepared by its first call that agreed.

    A steady call (the same kind as one before it: the same description or
    ``key``, data of the same dtype and shape, the same slot) finds its
    header already made (and written into the sent rows, when it was the
    last one), the data areas' typed views, the lane's key, the headers to
    compare and the views to return: its round is a copy in, the engine's
    exchange, one comparison and what it teaches the slot.
    """

    __slots__ = (
        "apart",
        "area",
        "areas",
        "block",
        "cap",
        "copies",
        "direct",
        "dtype",
        "empty",
        "flat",
        "floor",
        "header",
        "heads",
        "inline",
        "lane_key",
        "learnt",
        "like",
        "nbytes",
        "need",
        "parts",
        "quiet",
        "rows_apart",
        "shape",
        "small",
        "spread",
        "text",
        "used",
    )

    apart: bool  # the call asked for its parts apart
    area: torch.Tensor | None  # where the data is copied (or written): every sent row's
    areas: Areas | None  # the sent rows' data areas
    block: tuple[torch.Tensor, ...] | None  # the parts returned, as one (world, *part) tensor
    cap: int | None  # the most the slot learns from this kind (None: the engine's rule)
    copies: bool  # the call copies its data (no writer)
    direct: bool  # the data goes straight into the segment, or a writer writes it there
    dtype: torch.dtype | None  # the data's (None: a call without data)
    empty: bool  # data of no bytes: every rank's is an empty tensor
    flat: int  # the address of ``area`` where it is one contiguous run of the data's bytes
    floor: int  # the communicator's slot size
    header: bytes
    heads: tuple[bytes, ...] | bytes  # the header, once per gathered row (as host.heads)
    inline: bool  # the data rides
    lane_key: tuple[str, int, bool] | None  # the round's lane in engine.lanes
    learnt: int  # the slot's learnt room the round ran with
    need: int  # what the call teaches the slot
    like: torch.Tensor  # what one row's data is shaped like (a writer's area in the segment)
    nbytes: int  # its bytes
    rows_apart: bool  # the round sends row j to rank j (its lane's mode)
    # the views returned (each of these: one where the rows lie, two in a segment's
    # generations, :meth:`HostSlots.at`)
    parts: tuple[tuple[torch.Tensor, ...], ...] | None
    quiet: bool  # learning ``need`` again leaves the slot as it is
    shape: torch.Size | None
    small: bool  # the copy in stays under torch's grain: one op on this thread
    spread: torch.Tensor | None  # a writer's first row's area, copied into the others
    text: str  # the description (the same key, the same description): for a mismatch
    used: int  # the bytes of each sent row the data fills (a shared round copies those)

    def serves(
        self,
        floor: int,
        learnt: int,
        data: torch.Tensor | None,
        write: object,
        apart: bool,
    ) -> bool:
        """Whether a call with these arguments, on a slot that learnt ``learnt``, is this kind."""
        return (
            learnt == self.learnt
            and floor == self.floor
            and apart is self.apart
            and (write is None) is self.copies
            and (
                data is None
                if self.dtype is None
                else data is not None and data.dtype is self.dtype and data.shape == self.shape
            )
        )


def _prepare(
    host: HostSlots,
    engine: Engine,
    text: str,
    header: bytes,
    floor: int,
    data: torch.Tensor | None,
    write: object,
    asked_apart: bool,
    inline: bool,
    whole: bool,
    need: int,
    cap: int | None,
) -> Round:
    # what a steady call of this kind needs, made once (see Round)
    prep = Round()
    rooms = host.rooms
    prep.text, prep.header = text, header
    prep.heads = (header,) * host.world if host.world > 1 else header  # as host.heads cuts
    prep.floor, prep.learnt = floor, rooms.learnt
    prep.apart, prep.copies = asked_apart, write is None
    prep.dtype = None if data is None else data.dtype
    prep.shape = None if data is None else data.shape
    prep.inline = inline
    prep.need, prep.cap = need, cap
    # learning ``need`` again changes nothing while the slot stays as it is
    largest = 0 if need > (learn_cap(host.world) if cap is None else cap) else need
    prep.quiet = largest <= rooms.learnt <= 2 * largest
    apart = asked_apart and not whole
    # a shared round sends rows apart only for a call whose parts go apart
    prep.rows_apart = rows_apart = apart if host.shared else host.apart
    lane = None if host.shared else _lanes.round_lane(engine, host.slot_size, rows_apart)
    prep.lane_key = None if lane is None else ("all_gather_slots", host.slot_size, rows_apart)
    prep.area = prep.areas = prep.spread = prep.parts = prep.block = None
    prep.small = prep.empty = prep.direct = False
    prep.flat = 0
    prep.used = _used(host, 0)
    if data is None or not inline:
        return prep
    like = data[0] if apart else data
    nbytes = like.nbytes
    prep.used = _used(host, nbytes)
    if not nbytes:
        prep.empty = True
        return prep
    areas = host.sent.areas(like, nbytes)
    prep.direct = host.segment is not None and nbytes >= DIRECT_FROM
    # (its dtype and shape alone: a caller's tensor is not kept)
    prep.like, prep.nbytes = torch.empty((), dtype=like.dtype).expand(like.shape), nbytes
    spreads = host.spreads and not apart  # data for all, into every row
    prep.areas = areas if spreads else None
    prep.area = areas.every if apart or spreads else areas.first
    prep.small = prep.area.numel() < PARALLEL_FROM
    area = prep.area
    if area.is_contiguous() and area.nbytes == nbytes:
        prep.flat = area.data_ptr()  # (a slot the host keeps: its memory stays)
    # a writer fills the first row's area, then the others get copies (a true apart writes all)
    prep.spread = None if apart else areas.first
    # where the rows lie: the host's rows, or either generation of the segment's
    ats: tuple[At, ...] = (None,) if host.segment is None else ((0, apart), (1, apart))
    own = engine.rank if whole else None
    prep.parts = tuple(
        tuple(
            host.own_parts(like, nbytes, engine.rank, at)
            if whole
            else host.gathered(like, nbytes, at)
        )
        for at in ats
    )
    prep.block = tuple(_block(host, like, nbytes, own, at) for at in ats)
    return prep


def exchange(
    engine: Engine,
    what: str,
    description: str | Callable[[], str],
    serializer: Serializer,
    slot_size: int,
    data: torch.Tensor | None = None,
    timeout: datetime.timedelta | None = None,
    *,
    write: Callable[[torch.Tensor], object] | None = None,
    apart: bool = False,
    key: Hashable | None = None,
    into: torch.Tensor | None = None,
) -> list[torch.Tensor] | None:
    """Check that every rank passes the same ``description``; every rank's ``data`` if it fits.

    ``data`` (contiguous, on the backend's device) travels in the slot when
    it fits; then the result is every rank's ``data``, as views of the
    gathered slots shaped like ``data``, valid until the engine's next call.
    Otherwise the result is ``None`` and the caller runs the engine's
    collective. ``write``, when given, fills this rank's area (typed and
    shaped like ``data``) instead of copying ``data``: then ``data`` only
    gives the dtype and shape (every rank must declare the same), and a rank
    with nothing to send writes nothing and returns ``False`` (a scatter's
    ranks other than src).

    ``apart``: ``data`` holds a part for each rank along dim 0, ``data[j]``
    for rank ``j`` (a scatter's pieces on src, an all_to_all_single's
    chunks). Where the engine sends row ``j`` of the slots to rank ``j``
    (:meth:`~commlib.backend.Backend.sends_slot_rows_apart`), each part
    travels in its own row and the result is, from every rank ``r``, the
    part ``r`` meant for this rank: the slot needs the room of one part, not
    of ``data``. ``write`` then fills all the rows (``(world, *part)``).
    Where every rank gets every row (on the host), the parts travel whole,
    when all of ``data`` fits the slot, with the same result; off the host
    nothing rides: ``None``.

    ``description`` may be a callable that gives it; with ``key`` (a cheap
    hashable value that names the call as fully as the description does:
    the same key, the same description, on this rank) a steady call finds
    its round prepared by that key and never formats the description. A
    round is prepared per kind of call on the host (:class:`Round`) and
    reused while the data's dtype and shape, the slot and the call's mode
    stay the same; a call of another kind on any rank shows in the headers.

    ``into`` (on the host, shaped ``(world, *part)``, a part being what the
    result's tensors are shaped like): where the data rode, every rank's
    part is copied there too, in rank order, in one copy.

    Examples:
        >>> parts = exchange(engine, "all_reduce", "all_reduce(op=sum, torch.float32, (2,))",
        ...                  serializer, 4096, data=torch.ones(2))
        >>> len(parts) == engine.world_size
        True
    """
    host: HostSlots | None = engine.kept.get("check")
    if key is None:
        if not isinstance(description, str):
            description = description()
        key = description
    if host is not None:
        prep = host.rounds.get(key)
        if prep is not None and prep.serves(slot_size, host.rooms.learnt, data, write, apart):
            return steady(engine, host, prep, what, serializer, data, timeout, write, into)
    text = description if isinstance(description, str) else description()
    world = engine.world_size
    rooms = rooms_of(engine)
    floor, slot_size = slot_size, rooms.slot_bytes(slot_size)
    on_cpu = engine.on_cpu
    host = None
    if on_cpu:
        if "shared" not in engine.kept:  # set up by the engine's first slot round
            shared_rows(engine, what, timeout)
        host = _slots(engine, slot_size, rooms)
    asked_apart = apart
    # parts for each rank where the engine sends every rank every row: the parts
    # travel whole in the sender's slot, and each rank takes its own of each
    whole = apart and host is not None and not host.apart
    if whole:
        apart = False
    like = data[0] if apart and data is not None else data  # what one row carries
    nbytes = 0 if like is None else like.nbytes
    # every rank decides alike: on the slot, the engine and the declared size
    inline = (
        like is not None
        and nbytes <= slot_size - _DATA
        and (not apart or (host is not None and host.apart))
    )
    header = _header(text, nbytes, inline)
    if host is not None:
        if header != host.written:  # only this module writes the rows' headers
            host.sent.head(header)
            host.written = header
        wrote = 0
        direct = None  # data that goes straight into the segment
        if inline and nbytes and data is not None and like is not None:
            areas = host.sent.areas(like, nbytes)
            wrote = nbytes
            if host.segment is not None and nbytes >= DIRECT_FROM:
                if write is None:
                    direct = _flat(data, apart, world)
                else:  # the writer writes into the segment itself
                    there, direct = host.next_area(like, nbytes, apart)
                    if write(there) is False:
                        wrote, direct = 0, None
            elif apart:
                if write is None:
                    host_copy(areas.every, data)  # part j into row j, one op
                elif write(areas.every) is False:
                    wrote = 0
            elif write is None:
                # into every sent row at once (where the engine sends them apart)
                host_copy(areas.every if host.spreads else areas.first, data)
            elif write(areas.first) is not False:
                if host.spreads:
                    areas.spread()
            else:
                wrote = 0
        rows = host.rows
        rows_apart = apart if host.shared else host.apart
        lane = None if host.shared else _lanes.round_lane(engine, slot_size, rows_apart, timeout)
        _issue(engine, host, what, lane, timeout, _used(host, wrote), rows_apart, direct)
    else:
        device = engine.device()
        mine = torch.zeros(slot_size, dtype=torch.uint8, device=device)
        mine[:_HEADER_SIZE].copy_(torch.frombuffer(bytearray(header), dtype=torch.uint8))
        if inline and nbytes and data is not None:
            if write is None:
                mine[_DATA : _DATA + nbytes].copy_(byte_view(data))
            else:
                write(_typed(mine.narrow(0, _DATA, nbytes), data))
        every = torch.empty(world * slot_size, dtype=torch.uint8, device=device)
        rows = every.view(world, slot_size)
        engine.run(what, "all_gather_into_tensor", every, mine, timeout=timeout)
    if host is not None:
        raw = host.every_raw
        # the common case compares in place; the rows' headers are cut out on a mismatch
        agreed = all(map(raw.startswith, (header,) * world, host.starts))
        heads = [] if agreed else [raw[start : start + _HEADER_SIZE] for start in host.starts]
    else:
        gathered = rows[:, :_HEADER_SIZE].cpu().numpy()
        heads = [gathered[r].tobytes() for r in range(world)]
        agreed = all(h == header for h in heads)
    if not agreed:
        _disagree(engine, what, text, serializer, slot_size, heads)
    # every rank sent this rank's header (description and byte count): the slot
    # learns alike everywhere; a call without data needs no room, so a run of
    # them shrinks it
    need, cap = teaches(engine, nbytes, what in _catalog.EVERYONE_NEEDS_ALL)
    if apart and need and not _rows_apart(engine, rooms.slot_for(need, floor)):
        need = 0  # a slot that large would not go apart: the parts could not ride
    if host is not None:
        # the steady calls of this kind take the prepared round (before learning: the
        # round is prepared for the slot it ran on)
        if len(host.rounds) >= LAYOUTS:
            host.rounds.clear()
        host.rounds[key] = _prepare(
            host, engine, text, header, floor, data, write, asked_apart, inline, whole, need, cap
        )
    rooms.learn(need, world, cap)
    if like is None or not inline:
        return None
    if not nbytes:
        return [torch.empty_like(like[0] if whole else like) for _ in range(world)]
    if host is not None:
        at = host.at(apart)  # (where the data lies: in a segment, read there)
        if whole:
            parts = list(host.own_parts(like, nbytes, engine.rank, at))
        else:
            parts = list(host.gathered(like, nbytes, at))
        if into is not None:
            stack_into(into, parts)
        return parts
    assert data is not None  # not apart: off the host, parts never ride
    # slot sizes are multiples of 16 (Communicator, Rooms): rows aligned for every dtype
    block = rows.narrow(1, _DATA, nbytes)
    parts = [part.view(data.dtype).view(data.shape) for part in block.unbind(0)]
    if into is not None:
        stack_into(into, parts)
    return parts


def steady(
    engine: Engine,
    host: HostSlots,
    prep: Round,
    what: str,
    serializer: Serializer,
    data: torch.Tensor | None,
    timeout: datetime.timedelta | None,
    write: Callable[[torch.Tensor], object] | None,
    into: torch.Tensor | None = None,
) -> list[torch.Tensor] | None:
    # a prepared round (exchange): what changes from call to call is the data alone
    header = prep.header
    if header is not host.written:
        host.sent.head(header)
        host.written = header
    area = prep.area
    used = prep.used
    direct = None
    if area is not None:
        if prep.direct:
            if write is None:
                direct = _flat(data, prep.rows_apart, host.world)  # type: ignore[arg-type]
            else:  # the writer writes into the segment itself
                there, direct = host.next_area(prep.like, prep.nbytes, prep.rows_apart)
                if write(there) is False:
                    used, direct = _used(host, 0), None
        elif write is None:
            assert data is not None  # (an area: the data is declared)
            if prep.flat and is_plain_memory(data):
                copy_bytes(prep.flat, (data,), prep.nbytes)  # (no dispatcher: _host_copy)
            elif prep.small:
                area.copy_(data)
            else:
                host_copy(area, data)
        elif prep.spread is None:
            if write(area) is False:
                used = _used(host, 0)
        elif write(prep.spread) is not False:
            if prep.areas is not None:
                prep.areas.spread()
        else:
            used = _used(host, 0)
    lane_key = prep.lane_key
    lane = None if lane_key is None else engine.lanes.get(lane_key)
    if lane is not None and (
        (timeout is not None and lane.via != "shared")
        or (lane.unless_in and engine.group in lane.unless_in)
    ):
        lane = None  # another timeout or an open coalescing manager (_lanes.round_lane)
    _issue(engine, host, what, lane, timeout, used, prep.rows_apart, direct)
    raw = host.every_raw
    if host.heads(raw) != prep.heads:  # every row's header, in one comparison
        heads = [raw[start : start + _HEADER_SIZE] for start in host.starts]
        _disagree(engine, what, prep.text, serializer, host.slot_size, heads)
    rooms = host.rooms
    if not prep.quiet or rooms.smaller:
        rooms.learn(prep.need, host.world, prep.cap)
    every = prep.parts
    if every is not None:
        # where the rows lie: the generation of the segment this round took
        segment = host.segment
        at = 0 if segment is None else segment.published & 1
        if into is not None:
            block = prep.block[at]  # type: ignore[index]  # (parts: a block too)
            if prep.small:
                into.copy_(block)
            else:
                host_copy(into, block)
        return list(every[at])
    if prep.empty:
        assert data is not None
        like = data[0] if prep.apart else data
        return [torch.empty_like(like) for _ in range(host.world)]
    return None


def _flat(data: torch.Tensor, apart: bool, world: int) -> torch.Tensor:
    # the data's bytes as a segment's data lane takes them (apart: a row for each rank)
    flat = byte_view(data)
    return flat.view(world, -1) if apart else flat


def _used(host: HostSlots, nbytes: int) -> int:
    # the bytes of a sent row that matter: the data's, or any protocol's header alone
    return min(host.slot_size, _DATA + nbytes if nbytes else HEADER)


def _issue(
    engine: Engine,
    host: HostSlots,
    what: str,
    lane: DirectCall | None,
    timeout: datetime.timedelta | None,
    used: int,
    apart: bool,
    direct: torch.Tensor | None = None,
) -> None:
    # the round of the sent rows: the engine's own exchange in one step where a lane
    # serves, the plugin's all_gather_slots otherwise; a shared round copies the
    # ``used`` bytes of each row alone, of every row where they go ``apart``
    segment = host.segment
    if segment is not None and direct is not None:  # the data straight into the segment
        lane = segment.data_lane(host.slot_size, apart)
        assert lane is not None  # (the host's slot fits as it goes: _slots)
        engine.direct(what, lane, host.every, host.sent_upto(_DATA, apart), direct, limit=timeout)
    elif segment is not None:  # only the headers come out: the data is read where it lies
        lane = segment.heads_lane(host.slot_size, apart)
        assert lane is not None  # (the host's slot fits as it goes: _slots)
        rows = host.sent_upto(used, apart)
        if apart:
            engine.direct(what, lane, host.every, rows, [], [], limit=timeout)
        else:
            engine.direct(what, lane, host.every, rows, limit=timeout)
    elif lane is None:
        engine.run(what, "all_gather_slots", host.every, host.sent.rows, timeout=timeout)
    elif host.apart:
        engine.direct(what, lane, host.every, host.sent.rows, [], [], limit=timeout)
    else:
        engine.direct(what, lane, host.every, host.first, limit=timeout)


def _disagree(
    engine: Engine,
    what: str,
    description: str,
    serializer: Serializer,
    slot_size: int,
    heads: Sequence[bytes | bytearray],
) -> NoReturn:
    # the headers differ: every rank saw the same slots, so every rank takes this path
    world = engine.world_size
    strangers = [r for r, h in enumerate(heads) if _HEAD.unpack_from(h)[0] != _MAGIC]
    if strangers:
        # those ranks run another protocol (all_gather, an object collective),
        # which ends after this round: a second round here would wait for them
        raise RemoteArgumentError(
            what,
            {
                r: "another collective" if r in strangers else "a checked tensor collective"
                for r in range(world)
            },
            "ranks called different collectives",
        )
    texts = _objects.all_gather_object(engine, description, serializer, slot_size)
    names = sorted({t.split("(", 1)[0] for t in texts})
    raise RemoteArgumentError(
        "/".join(names),
        dict(enumerate(texts)),
        DIFFERENT,
        refused=any(REFUSED in t for t in texts),
    )


def agree(
    engine: Engine, what: str, description: str, serializer: Serializer, slot_size: int
) -> None:
    """Raise on every rank unless all ranks pass the same ``description``.

    The error shows each rank's description, so the difference is readable.
    The round is the argument check's (:func:`exchange`): a
    slot of the group's size, so a rank that called another collective
    meanwhile sends the same number of bytes and every rank raises, where a
    round of its own size would make gloo end the process.

    Examples:
        >>> agree(engine, "all_reduce_dict", "keys=['a', 'b']", serializer, 4096)
    """
    exchange(engine, what, f"{what}({description})", serializer, slot_size)
