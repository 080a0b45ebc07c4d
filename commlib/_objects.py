"""Object collectives, written once on top of the backends' tensor collectives.

Round one: every rank contributes a fixed-size *slot* (``slot_size`` bytes, the
communicator's) to one ``all_gather_into_tensor``. A slot carries the rank's status
(ok, failed, nothing to send), which collective it is in, its ``src``/``dst``
and, when the serialized object fits, the object itself. So:

* small objects complete in this one round;
* a rank that failed to serialize (or passed a bad argument) tells everyone in
  the same round, and every rank raises the same :class:`RemoteError`;
* ranks that disagree on the collective, ``src``/``dst`` or list length find
  out before any payload moves.

Round two runs only when some payload did not fit: its table of segment sizes
(header, then buffers) travels in the slot and the segments follow through the
backend's ``large_payload_transport``: ``"p2p"`` (send/recv to exactly the
ranks that need them; large buffers are sent straight from the object's memory
and received into one blob per sender) or ``"collective"`` (one padded
all_gather / gather / broadcast). A payload with too many buffers for its
table to fit the slot ("packed") first sends the table, then the segments.

Segments are laid out with every buffer at a 16-byte aligned offset, in the
slot and in the blob alike, so the receiver can view any dtype over them
without a copy.

Each protocol, ``*_steps``, is a generator of steps (:mod:`commlib._steps`):
it runs blocking, or starts with ``async_op=True`` and finishes in its
handle; the plain names (``all_gather_object``) run it blocking.
``scatter_object_list`` (:mod:`commlib._scatter_objects`) and the
point-to-point ``send_object_list`` / ``recv_object_list``
(:mod:`commlib._p2p_objects`) are built from the same slots and transfers.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from commlib import _validation as check
from commlib._rooms import need_of, rooms_of
from commlib._steps import Steps, call, run
from commlib.errors import DeserializationError, RemoteArgumentError, RemoteError
from commlib.serialization import (
    Payload,
    RefusedClassError,
    RefusedRemoteClassError,
    Serializer,
    uint8_view,
)

if TYPE_CHECKING:
    from commlib._engine import Engine

# slot: status, collective, reserved, root (src/dst or -1), aux (list length), body length
_SLOT = struct.Struct("<BBHiqQ")
_META = struct.Struct("<QI")  # header length, number of buffers; then one u64 per buffer
_PACKED = struct.Struct("<QQ")  # a packed payload's table length and blob length
_ALIGN = 16  # the largest element size (complex128): any dtype can view an aligned buffer

EMPTY, INLINE, TABLE, PACKED, FAILED, BAD_ARGUMENT = range(6)
ALL_GATHER, GATHER, BROADCAST, SCATTER, SEND = 1, 2, 3, 4, 5
OP_NAMES = {
    ALL_GATHER: "all_gather_object",
    GATHER: "gather_object",
    BROADCAST: "broadcast_object_list",
    SCATTER: "scatter_object_list",
    SEND: "send_object_list",
}

# a collective's op in round one (broadcast_object is broadcast_object_list of one)
_OP_CODES = {**{name: code for code, name in OP_NAMES.items()}, "broadcast_object": BROADCAST}

# round two: buffers below SMALL are coalesced into messages of up to CAP bytes
SMALL, CAP = 1 << 18, 1 << 20
# a "p2p" backend's round two goes through one collective while every blob is below this
# (on gloo a message costs a few milliseconds more than a collective round)
P2P_MIN = 1 << 20


def _layout(sizes: Sequence[int], start: int = 0) -> tuple[list[int], int]:
    """Offsets of segments laid end to end from ``start`` (all but the first aligned), and the end.

    Examples:
        >>> _layout([5, 3, 8])
        ([0, 16, 32], 40)
    """
    offsets, pos = [], start
    for i, n in enumerate(sizes):
        if i:
            pos = (pos + _ALIGN - 1) & -_ALIGN
        offsets.append(pos)
        pos += n
    return offsets, pos


def _meta(sizes: Sequence[int]) -> bytes:
    count = len(sizes) - 1
    return _META.pack(sizes[0], count) + struct.pack(f"<{count}Q", *sizes[1:])


def _sizes(data: Any, pos: int = 0) -> list[int]:
    """Segment sizes (header, then buffers) from a table at ``pos`` of ``data``."""
    header_len, count = _META.unpack_from(data, pos)
    return [header_len, *struct.unpack_from(f"<{count}Q", data, pos + _META.size)]


def _coalesce(sizes: Sequence[int]) -> list[list[int]]:
    """Group segment indices into messages: big segments alone, small ones together."""
    groups: list[list[int]] = []
    cur: list[int] = []
    cur_bytes = 0
    for i, size in enumerate(sizes):
        if size >= SMALL:
            if cur:
                groups.append(cur)
                cur, cur_bytes = [], 0
            groups.append([i])
            continue
        cur.append(i)
        cur_bytes += size
        if cur_bytes >= CAP:
            groups.append(cur)
            cur, cur_bytes = [], 0
    if cur:
        groups.append(cur)
    return groups


def _messages(sizes: Sequence[int]) -> list[tuple[int, int, list[int]]]:
    """Round-two messages of a payload: (blob start, blob end, segment indices), none empty."""
    offsets, _ = _layout(sizes)
    out = []
    for group in _coalesce(sizes):
        start, end = offsets[group[0]], offsets[group[-1]] + sizes[group[-1]]
        if end > start:
            out.append((start, end, group))
    return out


# received blobs of at least this many host bytes land in memory mapped for huge pages
HUGE = 4 << 20
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


def landing(size: int, device: torch.device) -> torch.Tensor:
    """An uninitialized 1-D uint8 tensor of ``size`` bytes to receive into, on ``device``.

    A large one in host memory is its own anonymous mapping, advised to use
    transparent huge pages where Linux offers them: the receive that fills it
    then takes one page fault per 2 MiB instead of one per 4 KiB (on a VM,
    faulting 64 MiB in 4 KiB pages cost about as much as moving it). The
    tensor keeps the mapping alive; so do the arrays and tensors a serializer
    builds over it, and the mapping is unmapped with the last of them.

    Examples:
        >>> landing(16, torch.device("cpu")).numel()
        16
    """
    if device.type != "cpu" or size < HUGE or _MADV_HUGEPAGE is None:
        return torch.empty(size, dtype=torch.uint8, device=device)
    try:
        region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError, AttributeError):
        return torch.empty(size, dtype=torch.uint8, device=device)
    try:
        region.madvise(_MADV_HUGEPAGE)
    except OSError:
        pass  # a kernel without transparent huge pages: plain pages
    return torch.frombuffer(region, dtype=torch.uint8)


def _host(t: torch.Tensor) -> memoryview:
    """The bytes of ``t`` (1-D uint8) in host memory."""
    return (t if t.device.type == "cpu" else t.cpu()).contiguous().numpy().data


class _Outgoing:
    """A rank's slot for round one and, if needed, its segments for round two."""

    def __init__(self, slot_size: int, op: int, root: int, aux: int):
        self.slot = bytearray(slot_size)
        self.head = (op, root, aux)
        self.segments: list[torch.Tensor] = []  # header, then buffers
        self.sizes: list[int] = []
        self.meta = b""  # the table of a packed payload
        self.error: BaseException | None = None  # what made a failed slot fail
        self._seal(EMPTY, 0)

    def _seal(self, status: int, body_len: int) -> None:
        self.status = status
        self.body_len = body_len
        op, root, aux = self.head
        _SLOT.pack_into(self.slot, 0, status, op, 0, root, aux, body_len)

    def seal(self, status: int, body: Any) -> None:
        """Put ``body`` after the slot's header, with ``status``."""
        self._seal(status, self._put(_SLOT.size, body) - _SLOT.size)

    def body(self) -> bytes:
        """The slot's body (a failed slot's body is the error's text)."""
        return bytes(self.slot[_SLOT.size : _SLOT.size + self.body_len])

    def used(self) -> bytes:
        """The slot's header and body, without the unused rest."""
        return bytes(self.slot[: _SLOT.size + self.body_len])

    def _put(self, pos: int, data: Any) -> int:
        end = pos + len(data)
        self.slot[pos:end] = data
        return end

    def fail(self, exc: BaseException, status: int = FAILED) -> None:
        self.error = exc
        room = len(self.slot) - _SLOT.size
        text = f"{type(exc).__name__}: {exc}".encode(errors="replace")[:room]
        self._seal(status, self._put(_SLOT.size, text) - _SLOT.size)

    def payload(self, payload: Payload) -> None:
        header, buffers = payload
        for b in buffers:
            if not isinstance(b, torch.Tensor) or b.dtype != torch.uint8 or b.dim() != 1:
                raise TypeError("a serializer's buffers must be 1-D uint8 tensors")
        sizes = [len(header), *(b.numel() for b in buffers)]
        meta = _meta(sizes)
        offsets, end = _layout(sizes, _SLOT.size + len(meta))
        if end <= len(self.slot):
            self._put(_SLOT.size, meta)
            self._put(offsets[0], header)
            for pos, b in zip(offsets[1:], buffers):
                if b.numel():
                    self._put(pos, _host(b))
            self._seal(INLINE, end - _SLOT.size)
            return
        self.segments, self.sizes = [uint8_view(header), *buffers], sizes
        if _SLOT.size + len(meta) <= len(self.slot):
            self._seal(TABLE, self._put(_SLOT.size, meta) - _SLOT.size)
        else:
            self.meta = meta
            body = _PACKED.pack(len(meta), _layout(sizes)[1])
            self._seal(PACKED, self._put(_SLOT.size, body) - _SLOT.size)


class _RoundOne:
    """Every rank's slot, as gathered in round one (in host memory)."""

    def __init__(self, host: torch.Tensor, raw: Any, slot_size: int, world: int):
        self.host = host  # a CPU uint8 tensor over ``raw``
        self.raw = memoryview(raw)
        self.slot_size = slot_size
        self.heads = [_SLOT.unpack_from(self.raw, r * slot_size) for r in range(world)]

    def status(self, r: int) -> int:
        return self.heads[r][0]

    def body(self, r: int) -> memoryview:
        start = r * self.slot_size + _SLOT.size
        return self.raw[start : start + self.heads[r][5]]

    def sizes(self, r: int) -> list[int]:
        """The segment sizes in a TABLE slot."""
        return _sizes(self.raw, r * self.slot_size + _SLOT.size)

    def inline(self, r: int) -> tuple[memoryview, list[torch.Tensor]]:
        """Header and buffers of an INLINE payload: views of the gathered slots."""
        base = r * self.slot_size
        sizes = _sizes(self.raw, base + _SLOT.size)
        offsets, _ = _layout(sizes, _SLOT.size + _META.size + 8 * (len(sizes) - 1))
        header = self.raw[base + offsets[0] : base + offsets[0] + sizes[0]]
        buffers = [self.host[base + o : base + o + n] for o, n in zip(offsets[1:], sizes[1:])]
        return header, buffers


def read_slots(received: torch.Tensor, slot_size: int, count: int) -> _RoundOne:
    """``count`` slots received in one uint8 tensor (on any device), readable here.

    Examples:
        >>> read_slots(torch.zeros(4096, dtype=torch.uint8), 4096, 1).status(0)
        0
    """
    host = received if received.device.type == "cpu" else received.cpu()
    return _RoundOne(host, host.numpy(), slot_size, count)


def _round_one(engine: Engine, out: _Outgoing, world: int) -> Steps[_RoundOne]:
    size = len(out.slot)
    what = OP_NAMES[out.head[0]]
    mine = engine.plugin.to_device(torch.frombuffer(out.slot, dtype=torch.uint8))
    if mine.device.type == "cpu":
        # host memory Python can parse without going through numpy
        raw: Any = bytearray(world * size)
        gathered = torch.frombuffer(raw, dtype=torch.uint8)
        yield from call(engine, what, engine.plugin.all_gather_into_tensor, gathered, mine)
        return _RoundOne(gathered, raw, size, world)
    gathered = torch.empty(world * size, dtype=torch.uint8, device=mine.device)
    yield from call(engine, what, engine.plugin.all_gather_into_tensor, gathered, mine)
    host = gathered.cpu()
    return _RoundOne(host, host.numpy(), size, world)


# what a slot of another protocol is (a checked tensor collective, all_gather's first
# round): its bytes at the op's place mean nothing here
_OTHER = "another collective"


def _agree(slots: _RoundOne, op: int) -> None:
    """Raise on every rank if any rank failed or the ranks disagree."""
    heads = slots.heads
    first = heads[0]
    if all(h[0] < FAILED and h[1] == first[1] and h[3:5] == first[3:5] for h in heads):
        return
    name = OP_NAMES[op]
    if len({h[1] for h in heads}) > 1:  # name every collective called, the same on every rank
        name = "/".join(sorted({OP_NAMES.get(h[1], _OTHER) for h in heads}))
    failed = {
        r: bytes(slots.body(r)).decode(errors="replace")
        for r, h in enumerate(heads)
        if h[0] in (FAILED, BAD_ARGUMENT)
    }
    if failed:
        if any(h[0] == BAD_ARGUMENT for h in heads):
            raise RemoteArgumentError(name, failed, refused=True)
        raise RemoteError(name, failed)
    for index, what in ((1, "collective"), (3, "src/dst"), (4, "list length")):
        values = [h[index] for h in heads]
        if len(set(values)) > 1:
            if index == 1:
                values = [OP_NAMES.get(v, _OTHER) for v in values]
            per_rank = {r: f"{what}={v}" for r, v in enumerate(values)}
            raise RemoteArgumentError(name, per_rank, f"ranks disagree on the {what}")


# -- round two -------------------------------------------------------------------------
def _outgoing_messages(engine: Engine, segments: list[torch.Tensor], sizes) -> list:
    """The messages :func:`_messages` describes, on the backend's device.

    A segment that is a message of its own is sent from its own memory; small
    ones are copied together (with their alignment padding).
    """
    to = engine.plugin.to_device
    offsets, _ = _layout(sizes)
    out = []
    for start, end, group in _messages(sizes):
        if len(group) == 1:
            out.append(to(segments[group[0]]).contiguous())
            continue
        msg = torch.zeros(end - start, dtype=torch.uint8)
        for i in group:
            pos = offsets[i] - start
            msg[pos : pos + sizes[i]].copy_(segments[i])
        out.append(to(msg))
    return out


def _blob(engine: Engine, segments: list[torch.Tensor], sizes, size: int) -> torch.Tensor:
    """All segments at their offsets in one tensor of ``size`` bytes (zero padded)."""
    device = engine.plugin.device()
    offsets, _ = _layout(sizes)
    if device.type == "cpu":
        # Python's memory copies: no tensor op per segment
        raw = bytearray(size)
        view = memoryview(raw)
        for pos, seg, n in zip(offsets, segments, sizes):
            if n:
                view[pos : pos + n] = _host(seg)
        return torch.frombuffer(raw, dtype=torch.uint8)
    blob = torch.zeros(size, dtype=torch.uint8, device=device)
    for pos, seg, n in zip(offsets, segments, sizes):
        blob[pos : pos + n].copy_(seg)
    return blob


def _transfer(
    engine: Engine,
    routes: list[tuple[int, int]],
    sizes: dict[int, list[int]],
    segments: list[torch.Tensor],
    what: str,
    transport: str,
) -> Steps[dict[int, torch.Tensor]]:
    """Move each sender's segments to its receivers; returns sender -> blob received here.

    ``routes`` are (sender, receiver) pairs; ``sizes[s]`` are sender ``s``'s
    segment sizes, known here for every sender that sends here (and for this
    rank when it sends ``segments``); ``transport`` is ``"p2p"`` or
    ``"collective"``, the same on every rank.
    """
    if transport != "p2p":
        return (yield from _transfer_collective(engine, routes, sizes, segments, what))
    return (yield from transfer_p2p(engine, routes, sizes, segments, what))


def transfer_p2p(
    engine: Engine,
    routes: list[tuple[int, int]],
    sizes: dict[int, list[int]],
    segments: list[torch.Tensor],
    what: str,
) -> Steps[dict[int, torch.Tensor]]:
    """:func:`_transfer` by send/recv between exactly the ranks of ``routes``."""
    me, dev = engine.rank, engine.plugin.device()
    blobs: dict[int, torch.Tensor] = {}
    recvs = []
    for sender, receiver in routes:
        if receiver == me:
            blob = landing(_layout(sizes[sender])[1], dev)
            blobs[sender] = blob
            recvs += [(blob[start:end], sender) for start, end, _ in _messages(sizes[sender])]
    targets = [r for s, r in routes if s == me]
    sends = []
    if targets:
        msgs = _outgoing_messages(engine, segments, sizes[me])
        sends = [(m, r) for r in targets for m in msgs]
    yield from call(engine, what, engine.plugin.exchange, sends, recvs)
    return blobs


def _transfer_collective(engine: Engine, routes, sizes, segments, what: str) -> Steps[dict]:
    me, world, dev = engine.rank, engine.world_size, engine.plugin.device()
    senders = sorted({s for s, _ in routes})
    receivers = {r for _, r in routes}
    # every rank pads to the same size, so the caller gives every rank every
    # sender's sizes (not only those of the senders it receives from)
    size = max(_layout(sizes[s])[1] for s in senders)

    def mine() -> torch.Tensor:
        if me in senders:
            return _blob(engine, segments, sizes[me], size)
        return torch.zeros(size, dtype=torch.uint8, device=dev)

    if len(senders) == 1 and receivers == set(range(world)) - {senders[0]}:
        src = senders[0]
        blob = mine() if me == src else torch.empty(size, dtype=torch.uint8, device=dev)
        yield from call(engine, what, engine.plugin.broadcast, blob, src)
        return {} if me == src else {src: blob}
    contribution = mine()
    if len(receivers) > 1:
        whole = torch.empty(world * size, dtype=torch.uint8, device=dev)
        yield from call(engine, what, engine.plugin.all_gather_into_tensor, whole, contribution)
        parts: Any = whole.view(world, size)
    else:
        (dst,) = receivers
        parts = [torch.empty_like(contribution) for _ in range(world)] if me == dst else None
        yield from call(engine, what, engine.plugin.gather, contribution, parts, dst)
        if me != dst:
            return {}
    return {s: parts[s] for s in senders if (s, me) in routes}


def _round_two(
    engine: Engine, out: _Outgoing, slots: _RoundOne, routes: list[tuple[int, int]]
) -> Steps[dict[int, tuple[Any, list[torch.Tensor]]]]:
    """Move the payloads that did not fit; returns sender -> (header, buffers) here."""
    me = engine.rank
    what = OP_NAMES[out.head[0]]
    senders = {s for s, _ in routes}
    sizes = {s: slots.sizes(s) for s in senders if slots.status(s) == TABLE}
    packed = sorted(s for s in senders if slots.status(s) == PACKED)
    transport = engine.plugin.large_payload_transport
    if transport == "p2p":
        # every rank reads the same slots, so every rank chooses the same way
        blob_lengths = [_layout(sizes[s])[1] for s in sizes]
        blob_lengths += [_PACKED.unpack_from(slots.body(s))[1] for s in packed]
        if max(blob_lengths, default=0) < P2P_MIN:
            transport = "collective"
    if packed:
        # the tables that did not fit the slots go first, then the segments
        meta_routes = [(s, r) for s, r in routes if s in packed]
        meta_sizes = {s: [_PACKED.unpack_from(slots.body(s))[0]] for s in packed}
        mine = [uint8_view(out.meta)] if me in packed else []
        tables = yield from _transfer(engine, meta_routes, meta_sizes, mine, what, transport)
        for s, blob in tables.items():
            sizes[s] = _sizes(_host(blob))
        if me in packed:
            sizes[me] = out.sizes
        if transport != "p2p":
            # the collective transport pads to the largest blob: every rank needs it
            for s in packed:
                sizes.setdefault(s, [0, _PACKED.unpack_from(slots.body(s))[1]])
    blobs = yield from _transfer(engine, routes, sizes, out.segments, what, transport)
    return {s: split_blob(blob, sizes[s]) for s, blob in blobs.items()}


def split_blob(blob: torch.Tensor, sizes: Sequence[int]) -> tuple[Any, list[torch.Tensor]]:
    """A received blob's header (host bytes) and buffers (views of the blob).

    Examples:
        >>> header, buffers = split_blob(torch.zeros(48, dtype=torch.uint8), [12, 20])
        >>> len(header), [b.numel() for b in buffers]
        (12, [20])
    """
    offsets, _ = _layout(sizes)
    if blob.is_cpu:  # one view of the whole blob: no tensor op for the header
        header = _host(blob)[offsets[0] : offsets[0] + sizes[0]]
    else:
        header = _host(blob[offsets[0] : offsets[0] + sizes[0]])
    buffers = [blob[o : o + n] for o, n in zip(offsets[1:], sizes[1:])]
    return header, buffers


def load_payload(
    ser: Serializer, me: int, sender: int, header: Any, buffers: list[torch.Tensor]
) -> Any:
    """``ser.loads``; a failure becomes a :class:`DeserializationError` naming both ranks.

    Examples:
        >>> load_payload(serializer, 1, 0, *serializer.dumps({"lr": 0.1}))
        {'lr': 0.1}
    """
    try:
        return ser.loads(header, buffers)
    except RefusedClassError as exc:
        raise RefusedRemoteClassError(exc.qualname, me, sender) from exc
    except Exception as exc:
        raise DeserializationError(
            f"rank {me} could not load the object sent by rank {sender}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _load(ser: Serializer, engine: Engine, slots: _RoundOne, received: dict, sender: int) -> Any:
    if slots.status(sender) == INLINE:
        header, buffers = slots.inline(sender)
    else:
        header, buffers = received[sender]
    return load_payload(ser, engine.rank, sender, header, buffers)


def _root_field(rank: Any) -> int:
    """``src``/``dst`` as the slot's int32 field; anything invalid becomes -2.

    The invalid value is reported by the argument check, not by ``struct``.
    """
    if isinstance(rank, int) and not isinstance(rank, bool) and -(2**31) <= rank < 2**31:
        return rank
    return -2


def _prepare(
    slot_size: int,
    op: int,
    root: int,
    aux: int,
    obj: Any,
    ser: Serializer,
    serialize: bool,
    arg_check: Callable[[], object] | None = None,
) -> _Outgoing:
    out = _Outgoing(slot_size, op, root, aux)
    try:
        if arg_check is not None:
            arg_check()
    except (TypeError, ValueError) as exc:
        out.fail(exc, BAD_ARGUMENT)
        return out
    if serialize:
        try:
            out.payload(ser.dumps(obj))
        except Exception as exc:
            out.fail(exc)
    return out


def refusal_steps(engine: Engine, what: str, error: BaseException, slot_size: int) -> Steps[None]:
    """Round one of the object collective ``what`` from a rank refusing its own arguments.

    The others, already in ``what``, find the refusal in its slot: every rank
    raises the same :class:`~commlib.errors.RemoteArgumentError` naming this
    rank; unless every rank refused alike, then this returns and each raises
    its own error (as the check's and the shapes' rounds do).

    Examples:
        >>> run(engine, refusal_steps(engine, "all_gather_object", ValueError("bad"), 4096))
        >>> # on 2 ranks, rank 1 in all_gather_object: RemoteArgumentError on both
    """
    op = _OP_CODES[what]
    out = _Outgoing(slot_size, op, -1, 0)
    out.fail(error, BAD_ARGUMENT)
    slots = yield from _round_one(engine, out, engine.world_size)
    ranks = range(engine.world_size)
    if all(slots.heads[r][:2] == (BAD_ARGUMENT, op) for r in ranks) and (
        len({bytes(slots.body(r)) for r in ranks}) == 1
    ):
        return
    _agree(slots, op)


def _need(slots: _RoundOne, r: int) -> int:
    """Bytes rank ``r``'s payload needs in a slot (0: none, or too many buffers to count)."""
    status = slots.status(r)
    if status == INLINE:
        return _SLOT.size + slots.heads[r][5]
    if status == TABLE:
        sizes = slots.sizes(r)
        return _layout(sizes, _SLOT.size + _META.size + 8 * (len(sizes) - 1))[1]
    return 0


def _learn(engine: Engine, slots: _RoundOne, world: int) -> None:
    """Let the group's slot learn this call's payloads (the same slots on every rank).

    Only up to ``_rooms.PAD_UP_TO`` (128 KiB): the slot is the first round of
    every collective of the group, and a loop that gathers a large object
    once per step would otherwise pad each of its small checked all_reduces.
    """
    largest = max(_need(slots, r) for r in range(world))
    rooms_of(engine).learn(need_of(largest, everyone_needs_all=False), world)


def _large(slots: _RoundOne, world: int) -> list[int]:
    """Ranks whose payload needs round two."""
    return [r for r in range(world) if slots.heads[r][0] in (TABLE, PACKED)]


def all_gather_object_steps(
    engine: Engine, obj: Any, ser: Serializer, slot_size: int
) -> Steps[list[Any]]:
    """See :meth:`commlib.Communicator.all_gather_object`.

    This rank's own entry is ``obj`` itself, not a copy.

    Examples:
        >>> steps = all_gather_object_steps(engine, {"rank": engine.rank}, serializer, 4096)
        >>> run(engine, steps)
        [{'rank': 0}]
        >>> # on 2 ranks: [{'rank': 0}, {'rank': 1}]
    """
    world, me = engine.world_size, engine.rank
    out = _prepare(slot_size, ALL_GATHER, -1, 0, obj, ser, True)
    slots = yield from _round_one(engine, out, world)
    _agree(slots, ALL_GATHER)
    _learn(engine, slots, world)
    routes = [(s, r) for s in _large(slots, world) for r in range(world) if r != s]
    received = (yield from _round_two(engine, out, slots, routes)) if routes else {}
    return [obj if r == me else _load(ser, engine, slots, received, r) for r in range(world)]


def gather_object_steps(
    engine: Engine, obj: Any, dst: int, ser: Serializer, slot_size: int
) -> Steps[list[Any] | None]:
    """See :meth:`commlib.Communicator.gather_object`.

    On ``dst``, its own entry is ``obj`` itself, not a copy.

    Examples:
        >>> run(engine, gather_object_steps(engine, engine.rank, 0, serializer, 4096))
        [0]
        >>> # on 2 ranks: [0, 1] on rank 0, None on rank 1
    """
    world, me = engine.world_size, engine.rank
    root = _root_field(dst)
    out = _prepare(
        slot_size, GATHER, root, 0, obj, ser, True, lambda: check.rank_in_range(dst, world, "dst")
    )
    slots = yield from _round_one(engine, out, world)
    _agree(slots, GATHER)
    _learn(engine, slots, world)
    routes = [(s, dst) for s in _large(slots, world) if s != dst]
    received = (yield from _round_two(engine, out, slots, routes)) if routes else {}
    if me != dst:
        return None
    return [obj if r == me else _load(ser, engine, slots, received, r) for r in range(world)]


def broadcast_object_list_steps(
    engine: Engine, object_list: Any, src: int, ser: Serializer, slot_size: int
) -> Steps[None]:
    """See :meth:`commlib.Communicator.broadcast_object_list`.

    Examples:
        >>> box = [{"lr": 0.1}] if engine.rank == 0 else [None]
        >>> run(engine, broadcast_object_list_steps(engine, box, 0, serializer, 4096))
        >>> box
        [{'lr': 0.1}]
    """
    world, me = engine.world_size, engine.rank
    root = _root_field(src)
    is_list = isinstance(object_list, list)

    def arg_check() -> None:
        if not is_list:
            raise TypeError(
                f"broadcast_object_list needs a list, got {type(object_list).__name__}"
            )
        check.rank_in_range(src, world, "src")

    aux = len(object_list) if is_list else -1
    out = _prepare(slot_size, BROADCAST, root, aux, object_list, ser, me == root, arg_check)
    slots = yield from _round_one(engine, out, world)
    _agree(slots, BROADCAST)
    _learn(engine, slots, world)
    routes = [(src, r) for r in range(world) if r != src] if _large(slots, world) else []
    received = (yield from _round_two(engine, out, slots, routes)) if routes else {}
    if me != src:
        object_list[:] = _load(ser, engine, slots, received, src)


# -- blocking forms, for code that needs the result at once ---------------------------------
def all_gather_object(engine: Engine, obj: Any, ser: Serializer, slot_size: int) -> list[Any]:
    """:func:`all_gather_object_steps`, run to its end.

    Examples:
        >>> all_gather_object(engine, "x", serializer, 4096)
        ['x']
    """
    return run(engine, all_gather_object_steps(engine, obj, ser, slot_size))


def gather_object(
    engine: Engine, obj: Any, dst: int, ser: Serializer, slot_size: int
) -> list[Any] | None:
    """:func:`gather_object_steps`, run to its end.

    Examples:
        >>> gather_object(engine, "x", 0, serializer, 4096)
        ['x']
    """
    return run(engine, gather_object_steps(engine, obj, dst, ser, slot_size))


def broadcast_object_list(
    engine: Engine, object_list: Any, src: int, ser: Serializer, slot_size: int
) -> None:
    """:func:`broadcast_object_list_steps`, run to its end.

    Examples:
        >>> box = ["x"]
        >>> broadcast_object_list(engine, box, 0, serializer, 4096)
    """
    run(engine, broadcast_object_list_steps(engine, object_list, src, ser, slot_size))
