"""Gathering tensors whose shapes may differ across ranks.

Ranks cannot know each other's shapes without asking, so the first round is a
fixed-size slot per rank: a header (status, dtype, shape, byte count) and, when
the tensor is small enough, the tensor's bytes too. Small tensors therefore
complete in that one round; larger ones follow in a second, padded all_gather.
A dtype or ndim that differs across ranks raises the same error everywhere.

The slot's room for data is learnt (:mod:`commlib._rooms`, shared with the
argument check): a loop gathering tensors of steady shapes completes each call
in one round from its second call on; the byte count of every round is still
the same on every rank, so no engine ever sees ranks disagree on a size. A
gather, whose data only ``dst`` keeps, teaches it only up to
``_rooms.PAD_UP_TO`` (as a broadcast does the check's): a larger slot would
send every rank's data to every rank. Where the group's rounds go through
shared memory a round copies only the bytes written and a large slot pads
nothing: there every gather teaches it up to the segment's room
(:func:`commlib._rooms.shared_cap`), and a gather or all_gather of up to
4 MiB a rank is one round.

What a kind of call sends (its header) and how its gathered data is viewed
are made once per kind and kept with the engine's slot, and the sent rows
are rewritten only when the header changes. When every rank's header is the
one this rank sent (the steady case: every rank passes the same dtype and
shape), the call is settled without reading a field: the data is one strided
view of the gathered slots. Any difference reads every header, as before.
"""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING, Any

import torch

from commlib import _lanes, _steps
from commlib._host_copy import copy_bytes, host_copy, is_plain_memory
from commlib._rooms import HEADER, Rooms, learns_up_to, teaches
from commlib._sent_slots import LAYOUTS, Areas, SentSlot, copies_of
from commlib._shared_rows import shared_rows
from commlib.dtypes import dtype_code, dtype_from_code
from commlib.errors import RemoteArgumentError

if TYPE_CHECKING:
    import datetime

    from commlib._engine import Engine
    from commlib._lanes import Lanes
    from commlib.backend import DirectCall

MAX_DIMS = 31
_HEADER = 36  # int64 fields: ok, dtype, ndim, nbytes, dims...; 288 bytes keeps data aligned
_HEADER_BYTES = _HEADER * 8
assert _HEADER_BYTES == HEADER


# results that came in the round are copied out of it where a slot is more than this
# many times their bytes: a view would keep every rank's whole slot alive (a loop
# keeping each step's 16-byte results would hold 32 KiB a step at 8 ranks)
_COMPACT = 2

# gathered slots up to this many bytes land in a bytearray, larger ones in torch.empty
_ZEROED_UP_TO = 64 << 10
# the sent rows kept on a device, all kinds together (a learnt slot may be 2 MiB a row)
_DEVICE_ROWS_BYTES = 8 << 20
_HEADS = struct.Struct(f"<{_HEADER}q")
_STRIDED = torch.strided
_ROOT = _HEADER - 1  # the field after the largest shape: a gather's dst


class _Layout:
    """What one kind of call sends and how its gathered data is viewed, made once.

    A kind is a dtype, shape, status, ``dst`` and slot size: a loop repeats a
    handful, and on a small CPU packing a header and each view op cost
    microseconds a call (the views of the data areas, as :mod:`commlib._sent_slots`
    makes its own once per layout).
    """

    __slots__ = (
        "areas",
        "compact",
        "header",
        "key",
        "nbytes",
        "offset",
        "sizes",
        "status",
        "strides",
    )

    def __init__(
        self, tensor: torch.Tensor, status: int, dst: int | None, slot: SentSlot, world: int
    ):
        ok = tensor.dim() <= MAX_DIMS
        nbytes = tensor.numel() * tensor.element_size()
        #: the kind of call, as :meth:`_Slots.layout` and :func:`steady` look it up
        self.key = (tensor.dtype, tensor.shape, status, dst)
        status = status if ok else TOO_MANY_DIMS
        fields = [status, dtype_code(tensor.dtype), tensor.dim(), nbytes]
        fields += list(tensor.shape) if ok else []
        # the whole header, zeros after the shape: equal calls have equal headers
        fields += [0] * (_ROOT - len(fields)) + [0 if dst is None else dst]
        self.status = status
        self.header = _HEADS.pack(*fields)
        self.nbytes = nbytes
        inline = ok and status != SHAPES and 0 < nbytes <= slot.size - _HEADER_BYTES
        #: this rank's data area in every sent row, when the data rides in the slot
        self.areas = slot.areas(tensor, nbytes) if inline else None
        # every rank's data in the gathered slots, ``(world, *shape)``, when all agree
        # (offsets in elements: a slot is a multiple of 16 bytes, the header 288)
        size = tensor.element_size()
        self.offset = _HEADER_BYTES // size
        self.sizes = (world, *tensor.shape)
        self.strides = (slot.size // size, *_contiguous_strides(tuple(tensor.shape)))
        #: whether the results get storage of their own (see _COMPACT)
        self.compact = slot.size > _COMPACT * nbytes


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


class _Slots:
    """One engine's sent slot (:class:`SentSlot`) and the layouts of the calls seen."""

    __slots__ = (
        "apart",
        "cap",
        "device_rows",
        "discard",
        "first",
        "header",
        "layouts",
        "sent",
        "spare",
        "steady",
        "world",
    )

    def __init__(self, engine: Engine, size: int):
        world = engine.world_size
        copies = copies_of(world, size, engine.on_cpu)
        if copies < world and engine.on_cpu and engine.sends_slot_rows_apart(size):
            # a larger slot the engine still sends apart (gloo's up to a megabyte in all,
            # a learnt 128 KiB one too): written into every row, it takes the engine's
            # exchange as it is, where gathering the one row repeats it anyway
            copies = world
        self.sent = SentSlot(copies, size, _HEADER_BYTES)
        #: the row an engine that gathers the first row gathers (a view made once)
        self.first = self.sent.rows[0]
        #: whether the engine sends row j to rank j (then every row is sent)
        self.apart = copies == engine.world_size and engine.sends_slot_rows_apart(size)
        #: the header the sent rows hold now: a call with the same one writes none
        self.header = b""
        self.layouts: dict[tuple[Any, ...], _Layout] = {}
        self.world = engine.world_size
        #: a small host landing buffer (bytes, tensor) no result refers to, for the
        #: next round: a call whose results are views of its buffer keeps it instead
        self.spare: tuple[bytearray, torch.Tensor] | None = None
        #: the landing buffer of the prepared gathers this rank is not ``dst`` of
        #: (their results are ``[]``): one for every kind, made when first needed
        self.discard: tuple[Any, torch.Tensor, None] | None = None
        #: the prepared rounds of steady calls (:class:`_Steady`), by kind of call
        self.steady: dict[tuple[Any, ...], _Steady] = {}
        #: on a device: per header, the sent row there and its data area (see device_row)
        self.device_rows: dict[bytes, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def device_row(
        self, engine: Engine, header: bytes, data: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The sent row on ``engine``'s device holding ``header``, and ``data``'s area in it.

        Made once per header (a kind of call: its dtype, shape and byte count),
        copied to the device once; a call then copies its data into the area
        on the device. ``data``: the call's data when it rides in the slot.
        """
        found = self.device_rows.get(header)
        if found is None:
            rows = len(self.device_rows)
            if rows >= LAYOUTS or rows * self.sent.size >= _DEVICE_ROWS_BYTES:
                self.device_rows.clear()
            host = torch.zeros(self.sent.size, dtype=torch.uint8)
            host[: len(header)] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
            row = host.to(engine.device())
            area = None
            if data is not None:
                nbytes = data.numel() * data.element_size()
                area = row.narrow(0, _HEADER_BYTES, nbytes).view(data.dtype).view(data.shape)
            found = self.device_rows[header] = (row, area)
        return found

    def give_back(self, gathered: torch.Tensor, raw: Any) -> None:
        """Keep ``gathered`` (over ``raw``) for the next round: nothing refers to it now."""
        if isinstance(raw, bytearray):
            self.spare = (raw, gathered)

    def layout(self, tensor: torch.Tensor, status: int, dst: int | None) -> _Layout:
        """The layout of a call sending ``tensor`` with ``status`` (and ``dst``)."""
        key = (tensor.dtype, tensor.shape, status, dst)
        found = self.layouts.get(key)
        if found is None:
            if len(self.layouts) >= LAYOUTS:
                self.layouts.clear()
            found = self.layouts[key] = _Layout(tensor, status, dst, self.sent, self.world)
        return found

    def head(self, header: bytes) -> None:
        """Write ``header`` into every sent row, unless they hold it already."""
        if header != self.header:
            self.sent.head(header)
            self.header = header


def _slots(engine: Engine, size: int) -> _Slots:
    found: _Slots | None = engine.kept.get("ragged")
    if found is None or found.sent.size != size:
        found = engine.kept["ragged"] = _Slots(engine, size)
    return found


def inline_room(slot_size: int) -> int:
    """Bytes of tensor data a slot of ``slot_size`` bytes carries after its header.

    Examples:
        >>> inline_room(4096)
        3808
    """
    return max(0, slot_size - _HEADER_BYTES) // 16 * 16


# a slot's first field: which protocol filled it, or why it carries no tensor;
# ``adapt_empty`` gathers say so in it, so ranks that differ there agree to fail
TOO_MANY_DIMS, GATHER, SHAPES, REFUSED, GATHER_ADAPTING, GATHER_TO = 0, 1, 2, 3, 4, 5
_CALLED = {
    GATHER: "all_gather",
    SHAPES: "all_gather_shapes",
    GATHER_ADAPTING: "all_gather",
    GATHER_TO: "gather",
}
_GATHERS = frozenset({GATHER, GATHER_ADAPTING})


def exchange(
    engine: Engine,
    tensor: torch.Tensor,
    what: str,
    *,
    room: int,
    timeout: datetime.timedelta | None = None,
    rooms: Rooms | None = None,
    shapes_only: bool = False,
    adapt_empty: bool = False,
    dst: int | None = None,
) -> tuple[list[list[int]], list[torch.Tensor] | None, torch.dtype]:
    """Every rank's shape, every rank's tensor if all fit ``room`` bytes, and their dtype.

    ``tensor`` must be contiguous and on the backend's device. With
    ``rooms``, the slot has the room it learnt (at least ``room``), and
    learns from this call. With ``shapes_only`` no data travels (nor is
    learnt from), and the result's tensors are ``None``; the slot is the
    same size, so a rank in another collective's first round meanwhile finds
    out instead of making the engine abort. With ``adapt_empty``, a tensor
    without elements takes the dtype and number of dims the others agree on
    (its shape becomes ``(0, *trailing dims of the first rank with data)``).
    With ``dst``, the round is a gather's to ``dst`` (whose data only ``dst``
    keeps): ranks that name different roots raise alike.

    The shapes in the result may be one list repeated (every rank's shape
    the same): read them, copy before changing one.

    Examples:
        >>> shapes, tensors, dtype = exchange(engine, torch.ones(2), "all_gather", room=3808)
        >>> shapes             # on 2 ranks, rank 1 passing torch.ones(3): [[2], [3]]
        [[2]]
    """
    size = _HEADER_BYTES + room
    if rooms is not None:
        size = rooms.slot_bytes(size)
    slots = _slots(engine, size)
    if shapes_only:
        status = SHAPES
    elif dst is not None:
        status = GATHER_TO
    else:
        status = GATHER_ADAPTING if adapt_empty else GATHER
    layout = slots.layout(tensor, status, dst)
    header = layout.header
    gathered, raw, stride = _round(engine, what, slots, header, layout.areas, tensor, timeout)
    world = engine.world_size
    for start in range(0, world * stride, stride):
        if not raw.startswith(header, start):
            break
    else:
        # every rank sent this rank's header: the same call everywhere, nothing to
        # agree on (and no header to read)
        nbytes = layout.nbytes
        if layout.status != TOO_MANY_DIMS and (nbytes or shapes_only):
            shapes = [list(tensor.shape)] * world
            if shapes_only:
                slots.give_back(gathered, raw)
                return shapes, None, tensor.dtype
            # a steady call teaches the slot nothing (Rooms.learn would only reset
            # counters that are reset): no call for it
            # a gather's data only dst keeps: through shared memory it rides as an
            # all_gather's does, otherwise it teaches the slot what a broadcast does
            need, cap = teaches(engine, nbytes, everyone_needs_all=dst is None)
            if rooms is not None and (
                rooms.smaller or not need <= rooms.learnt <= 2 * need or need > cap
            ):
                rooms.learn(need, world, cap)
            if layout.areas is None:  # too large for the slot: the caller's second round
                slots.give_back(gathered, raw)
                return shapes, None, tensor.dtype
            every = gathered.view(tensor.dtype).as_strided(
                layout.sizes, layout.strides, layout.offset
            )
            # (a call with a timeout of its own, or outside the learnt rooms, prepares none)
            learnt = rooms if timeout is None else None
            if layout.compact or (learnt is not None and isinstance(raw, bytearray)):
                if learnt is not None and isinstance(raw, bytearray):
                    # the next such call takes this round's buffer and views as they are
                    _prepare(engine, slots, layout, learnt, need, size, room, raw, gathered, every)
                else:
                    slots.give_back(gathered, raw)
                every = every.clone()  # one op: the results no longer hold the slots
            elif learnt is not None and engine.on_cpu:
                # larger: the results are views of this round's buffer (no copy out), and
                # the next such call gathers into one of its own
                _prepare(engine, slots, layout, learnt, need, size, room, None, None, None, dst)
            return shapes, list(every.unbind(0)), tensor.dtype
    heads = [_HEADS.unpack_from(raw, start) for start in range(0, world * stride, stride)]
    return _settle(
        engine, tensor, what, heads, gathered, size, rooms, shapes_only, adapt_empty, dst
    )


class _Steady:
    """A steady kind of call's round, prepared: the next such call sends and reads it as is.

    Made by :func:`exchange` after a call whose every rank sent this rank's
    header with data that rode in the slot, over the engine's own round (a
    direct call): what reads every rank's header from the gathered slots and
    how every rank's data is viewed in them are kept, so the next call of
    that kind (:func:`steady`) costs the copy into the slot, the round and
    one comparison of the headers. Where the gathered slots are small (up to
    :data:`_ZEROED_UP_TO` in all: a copy out costs less than making views of
    a new buffer), the round's buffer is kept too and the results are copied
    out of it; otherwise each call gathers into a buffer of its own and its
    results are views of it, as the whole way's are (no copy of every rank's
    data); a gather's other ranks, whose results are ``[]``, keep theirs.
    Valid while the slot's size is the same: the same learnt room and the
    same communicator slot.
    """

    __slots__ = (
        "area",
        "args",
        "at",
        "dtype",
        "every",
        "expected",
        "first",
        "fresh",
        "gathered",
        "header",
        "heads",
        "lane",
        "learnt",
        "nbytes",
        "need",
        "offset",
        "raw",
        "room",
        "rooms",
        "sizes",
        "strides",
        "teaches",
        "total",
    )

    def __init__(
        self,
        slots: _Slots,
        layout: _Layout,
        lane: DirectCall,
        rooms: Rooms,
        need: int,
        room: int,
        kept: tuple[Any, torch.Tensor, torch.Tensor | None] | None,
        cap: int,
    ):
        areas = layout.areas
        assert areas is not None  # (the data rides in the slot)
        self.header, self.lane, self.rooms = layout.header, lane, rooms
        #: the direct call's arguments after the gathered buffer: the engine's exchange
        #: of the rows, or its gather of the first
        self.args: tuple[Any, ...] = _sent_args(slots, lane, _HEADER_BYTES + areas.first.nbytes)
        #: the first row alone where that is all the lane sends (else None)
        self.first = self.args[0] if len(self.args) == 1 else None
        #: where this rank's data goes: the first row's area where the lane sends that
        #: alone, else every row's (one copy fills them all)
        self.area = areas.every if self.first is None else areas.first
        #: its address where the data goes there as plain memory (no dispatcher, see
        #: commlib._host_copy): one contiguous area, a real dtype (a complex tensor may
        #: carry a lazy conjugate, which only ``copy_`` resolves); else None
        dtype, shape = layout.key[0], layout.key[1]
        self.nbytes = math.prod(shape) * dtype.itemsize
        whole = self.area.is_contiguous() and self.area.nbytes == self.nbytes
        self.at = self.area.data_ptr() if whole and not dtype.is_complex else None
        #: the slot's size follows from these two: a call with others sizes it anew
        self.learnt, self.room = rooms.learnt, room
        self.need = need
        #: whether a steady call still teaches the rooms (see exchange): they shrink
        self.teaches = not need <= rooms.learnt <= 2 * need or need > cap
        world, size = slots.world, slots.sent.size
        #: bytes gathered: a buffer of its own for every call (``fresh``) unless kept
        self.total = world * size
        self.fresh = kept is None
        if kept is None:
            raw, gathered, every = None, torch.empty(0, dtype=torch.uint8), None
        else:
            raw, gathered, every = kept
        #: the kept buffer (over ``raw``, read by ``heads``) and every rank's data in it
        self.raw, self.gathered, self.every = raw, gathered, every
        #: how every rank's data is viewed in a fresh buffer: ``(world, *shape)``
        self.dtype, self.sizes = layout.key[0], layout.sizes
        self.strides, self.offset = layout.strides, layout.offset
        #: every rank's header in the gathered slots, read in one step, and this rank's
        #: header as often: equal when every rank made this call
        gap = size - _HEADER_BYTES
        self.heads = struct.Struct(f"{_HEADER_BYTES}s{gap}x" * (world - 1) + f"{_HEADER_BYTES}s")
        self.expected = (layout.header,) * world


def _prepare(
    engine: Engine,
    slots: _Slots,
    layout: _Layout,
    rooms: Rooms,
    need: int,
    size: int,
    room: int,
    raw: bytearray | None,
    gathered: torch.Tensor | None,
    every: torch.Tensor | None,
    dst: int | None = None,
) -> None:
    """Keep this steady round's reading for the next one: with ``raw`` (``gathered``
    over it, ``every`` its data), its buffer too; a gather's other ranks keep one of
    their own (their results are ``[]``); else the next call gathers into a new one."""
    lane = _lanes.round_lane(engine, size, slots.apart)
    if lane is None or rooms.slot_bytes(_HEADER_BYTES + room) != size:
        if raw is not None and gathered is not None:
            slots.give_back(gathered, raw)  # sized anew next call: nothing to prepare
        return
    kept: tuple[Any, torch.Tensor, torch.Tensor | None] | None = None
    if raw is not None and gathered is not None:
        kept = (raw, gathered, every)
    elif dst is not None and dst != engine.rank:
        kept = slots.discard
        if kept is None:
            own = torch.empty(slots.world * size, dtype=torch.uint8)
            kept = slots.discard = (own.numpy(), own, None)
    steady = slots.steady
    if len(steady) >= LAYOUTS:
        steady.clear()
    cap = learns_up_to(engine)
    steady[layout.key] = _Steady(slots, layout, lane, rooms, need, room, kept, cap)


def _serving(lanes: Lanes, tensor: Any, timeout: Any) -> Engine | None:
    """The engine a steady entry may serve ``tensor`` on: a blocking call with the
    communicator's timeout, a plain strided CPU tensor, no step unfinished; else None."""
    engine = lanes.engine
    if (
        engine is None
        or timeout is not None
        or type(tensor) not in _lanes.PLAIN
        or _steps.unfinished
        or not tensor.is_cpu
        or tensor.layout is not _STRIDED
    ):
        return None
    return engine


def steady_gather(
    lanes: Lanes, tensor: Any, dst: Any, timeout: Any, slot_size: int
) -> list[torch.Tensor] | tuple[list[list[int]], list[torch.Tensor] | None, torch.dtype] | None:
    """``Communicator.gather``'s fast entry: :func:`steady` where it may serve the call.

    A blocking call with the communicator's timeout, a plain strided CPU
    tensor, ``dst`` an int (a kind found prepared was validated before).

    Examples:
        >>> steady_gather(comm._lanes, torch.ones(2), 0, None, comm.slot_size) is None
        True
    """
    engine = _serving(lanes, tensor, timeout)
    if engine is None or type(dst) is not int:
        return None
    return steady(engine, tensor, "gather", GATHER_TO, dst, slot_size)


def steady_all_gather(
    lanes: Lanes, tensor: Any, timeout: Any, adapt_empty: bool, slot_size: int
) -> list[torch.Tensor] | tuple[list[list[int]], list[torch.Tensor] | None, torch.dtype] | None:
    """``Communicator.all_gather``'s fast entry: :func:`steady` where it may serve the call.

    As :func:`steady_gather` (in every mode of the check: the round is
    all_gather's check); this rank's own entry of the result is ``tensor`` itself.

    Examples:
        >>> steady_all_gather(comm._lanes, torch.ones(2), None, False, comm.slot_size) is None
        True
    """
    engine = _serving(lanes, tensor, timeout)
    if engine is None:
        return None
    status = GATHER_ADAPTING if adapt_empty else GATHER
    found = steady(engine, tensor, "all_gather", status, None, slot_size)
    if type(found) is list:
        found[engine.rank] = tensor  # autograd flows through this rank's own entry
    return found


def steady(
    engine: Engine, tensor: torch.Tensor, what: str, status: int, dst: int | None, slot_size: int
) -> list[torch.Tensor] | tuple[list[list[int]], list[torch.Tensor] | None, torch.dtype] | None:
    """A call of a steady kind in its prepared round, or ``None`` (nothing sent).

    ``tensor``: a plain, strided CPU tensor on an engine on the CPU, the
    call's timeout the communicator's; ``status`` and ``dst`` as
    :func:`exchange` sends them, ``slot_size`` the communicator's. Returns
    every rank's tensor (new tensors; ``[]`` on a gather's other ranks) when
    every rank sent this rank's header, as :func:`exchange` would have; where
    one did not, what :func:`exchange` returns for the round, for the caller
    to go on from (or the same error on every rank). ``None``: no prepared
    round for this kind and slot: the caller goes the whole way.

    Examples:
        >>> steady(engine, torch.ones(2), "all_gather", GATHER, None, 4096) is None  # none yet
        True
    """
    slots: _Slots | None = engine.kept.get("ragged")
    if slots is None:
        return None
    key = (tensor.dtype, tensor.shape, status, dst)
    found = slots.steady.get(key)
    if found is None:
        return None
    rooms, lane = found.rooms, found.lane
    pending = lane.unless_in
    if (
        rooms.learnt != found.learnt
        or (slot_size - _HEADER_BYTES) // 16 * 16 != found.room
        or (pending and engine.group in pending)
    ):
        return None
    if found.header is not slots.header:
        slots.head(found.header)
    # (a tensor that requires grad is sent as its data, as Engine.to_device does)
    # (on this thread: torch would split a large copy across threads that wait for the
    # other ranks' on a few shared cores, see commlib._host_copy)
    at = found.at
    if at is not None and is_plain_memory(tensor):
        copy_bytes(at, (tensor,), found.nbytes)
    else:
        host_copy(found.area, tensor.detach() if tensor.requires_grad else tensor)
    fresh = found.fresh
    # a buffer of its own (the results are views of it), or the kept one
    gathered = torch.empty(found.total, dtype=torch.uint8) if fresh else found.gathered
    first = found.first
    if first is not None:  # the engine's gather of the first row, its two arguments spelt out
        engine.direct(what, lane, gathered, first)
    else:  # the rows apart
        engine.direct(what, lane, gathered, *found.args)
    raw: Any = gathered.numpy() if fresh else found.raw
    if found.heads.unpack_from(raw) != found.expected:
        if not found.fresh:  # the results may be views of this buffer: it is theirs now
            del slots.steady[key]
        return _unsteady(engine, tensor, what, found, gathered, raw, status, dst)
    if rooms.smaller or found.teaches:
        rooms.learn(found.need, engine.world_size, learns_up_to(engine))
    if dst is not None and engine.rank != dst:
        return []
    every = found.every
    if every is None:  # a fresh buffer (a gather's other ranks kept theirs: returned above)
        every = gathered.view(found.dtype).as_strided(found.sizes, found.strides, found.offset)
        return list(every.unbind(0))
    return list(every.clone().unbind(0))


def _unsteady(
    engine: Engine,
    tensor: torch.Tensor,
    what: str,
    found: _Steady,
    gathered: torch.Tensor,
    raw: Any,
    status: int,
    dst: int | None,
) -> tuple[list[list[int]], list[torch.Tensor] | None, torch.dtype]:
    """:func:`steady`'s round (``gathered``, over ``raw``) where some rank sent another
    header: as :func:`exchange` ends."""
    size = found.total // engine.world_size
    heads = [_HEADS.unpack_from(raw, at) for at in range(0, found.total, size)]
    adapt_empty = status == GATHER_ADAPTING
    return _settle(
        engine,
        tensor.detach(),
        what,
        heads,
        gathered,
        size,
        found.rooms,
        False,
        adapt_empty,
        dst,
    )


def _settle(
    engine: Engine,
    tensor: torch.Tensor,
    what: str,
    heads: list[tuple[int, ...]],
    gathered: torch.Tensor,
    size: int,
    rooms: Rooms | None,
    shapes_only: bool,
    adapt_empty: bool,
    dst: int | None,
) -> tuple[list[list[int]], list[torch.Tensor] | None, torch.dtype]:
    """:func:`exchange`'s result from headers that differ: raise alike, or shapes that differ."""
    room = size - _HEADER_BYTES
    _agree_on_adapting(what, heads)
    if adapt_empty and all(h[0] == GATHER_ADAPTING for h in heads):
        heads = _adapted(heads)
    _agree(what, heads, gathered, size)
    if dst is not None and len({h[_ROOT] for h in heads}) > 1:
        roots = {r: f"dst={h[_ROOT]}" for r, h in enumerate(heads)}
        raise RemoteArgumentError(what, roots, "ranks passed different arguments")
    shapes = [list(h[4 : 4 + h[2]]) for h in heads]
    dtype = tensor.dtype
    if adapt_empty and isinstance(agreed := dtype_from_code(heads[0][1]), torch.dtype):
        dtype = agreed
    if shapes_only:
        return shapes, None, dtype
    if rooms is not None:
        # a gather's data only dst keeps: (exchange) as a broadcast's or through shared
        # memory as an all_gather's
        largest = max(h[3] for h in heads)
        need, cap = teaches(engine, largest, everyone_needs_all=dst is None)
        rooms.learn(need, engine.world_size, cap)
    if any(h[3] > room for h in heads):
        return shapes, None, dtype
    world = engine.world_size
    rows = gathered.view(world, size)
    tensors = [
        rows[r].narrow(0, _HEADER_BYTES, h[3]).view(dtype).reshape(shapes[r])
        for r, h in enumerate(heads)
    ]
    if size > _COMPACT * max(h[3] for h in heads):
        tensors = [t.clone() for t in tensors]  # see _COMPACT
    return shapes, tensors, dtype


def _adapted(heads: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """``heads`` with every empty tensor's dtype and dims those of the first rank with data.

    For a round where every rank gathers with ``adapt_empty``. An empty tensor
    adapts only to a rank with data that has dims (a 0-dim tensor has an
    element; no empty one is like it).
    """
    full = [h for h in heads if h[3] > 0]
    if not full or full[0][2] == 0:
        return heads
    like = full[0]
    ndim = like[2]
    empty = (like[0], like[1], ndim, 0, 0, *like[5:])
    return [empty if h[3] == 0 and (h[1], h[2]) != (like[1], ndim) else h for h in heads]


def _agree_on_adapting(what: str, heads: list[tuple[int, ...]]) -> None:
    """Raise on every rank when some ranks gather with ``adapt_empty`` and others without.

    Checked before adapting: the ranks' views of the headers still agree, so
    every rank raises the same error (otherwise the ranks that adapt could
    succeed where the others raise).
    """
    if {h[0] for h in heads} != _GATHERS:
        return  # agreed, or a refusal or another collective: ``_agree`` says which
    per_rank = {r: f"adapt_empty={h[0] == GATHER_ADAPTING}" for r, h in enumerate(heads)}
    raise RemoteArgumentError(what, per_rank, "ranks passed different adapt_empty")


def refuse(
    engine: Engine,
    what: str,
    refusal: str,
    *,
    room: int,
    timeout: datetime.timedelta | None = None,
    rooms: Rooms | None = None,
) -> None:
    """Join ``what``'s round with this rank's ``refusal`` instead of a tensor.

    Every rank raises a :class:`~commlib.errors.RemoteArgumentError` showing
    the refusal, unless every rank refused alike: then this returns, and each
    rank raises its own error.

    Examples:
        >>> refuse(engine, "all_gather", "tensor must be a torch.Tensor, got list", room=3808)
    """
    text = refusal.encode()[:room]  # the slot has at least this room, on every rank
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8) if text else None
    size = _HEADER_BYTES + room
    if rooms is not None:
        size = rooms.slot_bytes(size)
    slots = _slots(engine, size)
    header = _HEADS.pack(REFUSED, 0, 0, len(text), *[0] * (_HEADER - 4))
    areas = None if data is None else slots.sent.areas(data, len(text))
    gathered, raw, stride = _round(engine, what, slots, header, areas, data, timeout)
    world = engine.world_size
    heads = [_HEADS.unpack_from(raw, start) for start in range(0, world * stride, stride)]
    texts = {r: _refusal(gathered, size, h, r) for r, h in enumerate(heads)}
    if len(set(texts.values())) > 1:
        _agree(what, heads, gathered, size)


def _sent_args(slots: _Slots, lane: DirectCall, used: int) -> tuple[Any, ...]:
    """The round's lane's arguments after the gathered buffer: the rows apart or the first;
    through shared memory only their ``used`` bytes (the rest is read from nobody)."""
    rows = slots.sent.rows
    if lane.via == "shared":
        return (rows[:, :used], [], []) if slots.apart else (rows[0, :used],)
    return (rows, [], []) if slots.apart else (slots.first,)


def _round(
    engine: Engine,
    what: str,
    slots: _Slots,
    header: bytes,
    areas: Areas | None,
    data: torch.Tensor | None,
    timeout: datetime.timedelta | None,
) -> tuple[torch.Tensor, bytes | bytearray, int]:
    """One round of slots: what was gathered, its headers' bytes and their stride in them.

    ``areas`` (this rank's data area in the sent rows) takes ``data`` when
    given; the header is written only when the rows hold another.
    """
    size = slots.sent.size
    world = engine.world_size
    if engine.on_cpu:
        if "shared" not in engine.kept:  # set up by the engine's first slot round
            shared_rows(engine, what, timeout)
        slots.head(header)
        if areas is not None and data is not None:
            host_copy(areas.every, data)  # into every row at once, on this thread
        raw = None
        if world * size <= _ZEROED_UP_TO:
            spare = slots.spare
            if spare is not None:  # the last round's, no result refers to it: every
                raw, gathered = spare  # byte is written again
                slots.spare = None
            else:  # small: the cheapest buffer to read headers from
                raw = bytearray(world * size)
                gathered = torch.frombuffer(raw, dtype=torch.uint8)
        else:
            # not zeroed: the round fills every byte, and zeroing megabytes costs
            gathered = torch.empty(world * size, dtype=torch.uint8)
        lane = _lanes.round_lane(engine, size, slots.apart, timeout)
        if lane is None:
            rows = slots.sent.rows
            engine.run(what, "all_gather_slots", gathered, rows, timeout=timeout)
        else:  # the engine's own exchange of the rows or gather of the first, in one step
            used = _HEADER_BYTES + (data.nbytes if areas is not None and data is not None else 0)
            engine.direct(what, lane, gathered, *_sent_args(slots, lane, used), limit=timeout)
        if raw is not None:
            return gathered, raw, size
    else:
        # the row on the device, its header written once per kind: the data goes in from
        # the device (no host copy of it, no copy of the row to the device: each would
        # wait for the stream); only the headers come back, below
        row, area = slots.device_row(engine, header, data if areas is not None else None)
        if area is not None and data is not None:
            area.copy_(data)
        gathered = torch.empty(world * size, dtype=torch.uint8, device=row.device)
        lane = _lanes.round_lane(engine, size) if timeout is None else None
        if lane is None:
            engine.run(what, "all_gather_into_tensor", gathered, row, timeout=timeout)
        else:  # the engine's own all_gather, as on the host
            engine.direct(what, lane, gathered, row)
    # large, or on a device: only the headers come back to be read
    heads = gathered.view(world, size)[:, :_HEADER_BYTES].cpu().numpy().tobytes()
    return gathered, heads, _HEADER_BYTES


def _agree(what: str, heads: list[tuple[int, ...]], gathered: torch.Tensor, size: int) -> None:
    """Raise the same error on every rank unless every rank sent a tensor the others can take."""
    statuses = {h[0] for h in heads}
    if REFUSED in statuses:
        said = {r: _refusal(gathered, size, h, r) or _said(h) for r, h in enumerate(heads)}
        refused = [r for r, h in enumerate(heads) if h[0] == REFUSED]
        raise RemoteArgumentError(
            what, said, f"{_ranks(refused)} refused its arguments", refused=True
        )
    if TOO_MANY_DIMS in statuses:
        bad = {
            r: f"tensor has more than {MAX_DIMS} dims"
            for r, h in enumerate(heads)
            if h[0] == TOO_MANY_DIMS
        }
        raise RemoteArgumentError(what, bad)
    if len(statuses) > 1 or not statuses <= _CALLED.keys():
        called = {r: _CALLED.get(h[0], "another collective") for r, h in enumerate(heads)}
        raise RemoteArgumentError(what, called, "ranks called different collectives")
    if len({(h[1], h[2]) for h in heads}) > 1:
        per_rank = {r: _said(h) for r, h in enumerate(heads)}
        raise RemoteArgumentError(what, per_rank, "ranks passed different dtypes or ndims")


def _refusal(gathered: torch.Tensor, size: int, head: tuple[int, ...], rank: int) -> str:
    """The refusal in ``rank``'s slot, or ``""`` for a slot that carries none."""
    if head[0] != REFUSED or not 0 <= head[3] <= size - _HEADER_BYTES:
        return ""
    start = rank * size + _HEADER_BYTES
    text = bytes(gathered[start : start + head[3]].cpu().numpy())
    return "refused: " + text.decode(errors="replace")


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _said(head: tuple[int, ...]) -> str:
    """What a rank's header says it passed; a slot of another protocol says nothing."""
    dtype = dtype_from_code(head[1])
    if isinstance(dtype, str) or not 0 <= head[2] <= MAX_DIMS:
        return "another collective"
    return f"dtype={dtype}, ndim={head[2]}"
