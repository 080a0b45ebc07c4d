"""The object slot: the wire format every object collective starts with.

A *slot* is ``slot_size`` bytes (the communicator's): a fixed header
(:data:`SLOT`: status, collective, reserved, root, aux, body length), then a
body. The status says what the body is:

* ``EMPTY``: nothing to send; ``FAILED`` / ``BAD_ARGUMENT``: the error's text;
* ``INLINE``: the whole payload, a table of segment sizes (:data:`TABLE_HEAD`,
  then one u64 per buffer) followed by the header and the buffers;
* ``TABLE``: the table alone, the segments follow in round two;
* ``PACKED``: even the table did not fit: :data:`PACKED_HEAD` (table length,
  blob length), the table and the segments follow in round two.

Segments are laid out with every buffer at an :data:`ALIGN`-byte aligned
offset (:func:`layout`), in the slot and in the blob of round two alike, so the
receiver can view any dtype over them without a copy. :class:`Outgoing` writes
a rank's slot; :func:`read_slots` reads slots received; :func:`split_blob`
reads a round-two blob. The protocols that move slots are in
:mod:`commlib._objects`, :mod:`commlib._scatter_objects` and
:mod:`commlib._p2p_objects`.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Sequence
from typing import Any

import torch

from commlib import _catalog
from commlib.serialization import Payload, Serializer, uint8_view

# slot: status, collective, reserved, root (src/dst or -1), aux (list length), body length
SLOT = struct.Struct("<BBHiqQ")
TABLE_HEAD = struct.Struct("<QI")  # header length, number of buffers; then one u64 per buffer
PACKED_HEAD = struct.Struct("<QQ")  # a packed payload's table length and blob length
ALIGN = 16  # the largest element size (complex128): any dtype can view an aligned buffer

EMPTY, INLINE, TABLE, PACKED, FAILED, BAD_ARGUMENT = range(6)
# a collective's op code in round one and back, from the catalog's rows
# (broadcast_object is broadcast_object_list of one)
OP_NAMES = _catalog.SLOT_NAMES
OP_CODES = _catalog.SLOT_CODES
ALL_GATHER, GATHER = OP_CODES["all_gather_object"], OP_CODES["gather_object"]
BROADCAST, SCATTER = OP_CODES["broadcast_object_list"], OP_CODES["scatter_object_list"]
SEND = OP_CODES["send_object_list"]

# round two: buffers below SMALL are coalesced into messages of up to CAP bytes
SMALL, CAP = 1 << 18, 1 << 20


def layout(sizes: Sequence[int], start: int = 0) -> tuple[list[int], int]:
    """Offsets of segments laid end to end from ``start`` (all but the first aligned), and the end.

    Examples:
        >>> layout([5, 3, 8])
        ([0, 16, 32], 40)
    """
    offsets, pos = [], start
    for i, n in enumerate(sizes):
        if i:
            pos = (pos + ALIGN - 1) & -ALIGN
        offsets.append(pos)
        pos += n
    return offsets, pos


def table_bytes(sizes: Sequence[int]) -> bytes:
    """The table of segment sizes (header, then buffers) as it travels.

    Examples:
        >>> read_table(table_bytes([12, 20, 4]))
        [12, 20, 4]
    """
    count = len(sizes) - 1
    return TABLE_HEAD.pack(sizes[0], count) + struct.pack(f"<{count}Q", *sizes[1:])


def read_table(data: Any, pos: int = 0) -> list[int]:
    """Segment sizes (header, then buffers) from a table at ``pos`` of ``data``.

    Examples:
        >>> read_table(table_bytes([7]))
        [7]
    """
    header_len, count = TABLE_HEAD.unpack_from(data, pos)
    return [header_len, *struct.unpack_from(f"<{count}Q", data, pos + TABLE_HEAD.size)]


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


def messages(sizes: Sequence[int]) -> list[tuple[int, int, list[int]]]:
    """Round-two messages of a payload: (blob start, blob end, segment indices), none empty.

    Small segments travel together, a large one (``SMALL`` bytes or more) alone.

    Examples:
        >>> messages([10, 20, SMALL])
        [(0, 36, [0, 1]), (48, 262192, [2])]
    """
    offsets, _ = layout(sizes)
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


def host_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of ``t`` (1-D uint8) in host memory.

    Examples:
        >>> bytes(host_bytes(torch.tensor([1, 2], dtype=torch.uint8)))
        b'\\x01\\x02'
    """
    return (t if t.device.type == "cpu" else t.cpu()).contiguous().numpy().data


class Outgoing:
    """A rank's slot for round one and, if needed, its segments for round two.

    Examples:
        >>> out = Outgoing(4096, ALL_GATHER, -1, 0)
        >>> out.payload(serializer.dumps({"lr": 0.1}))
        >>> out.status == INLINE
        True
    """

    def __init__(self, slot_size: int, op: int, root: int, aux: int):
        self.size = slot_size
        # only the bytes written so far: a slot learnt large by a tensor call costs
        # nothing to set up where the round copies only them (a shared round)
        self._written = bytearray(SLOT.size)
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
        SLOT.pack_into(self._written, 0, status, op, 0, root, aux, body_len)

    @property
    def slot(self) -> bytearray:
        """The whole slot, ``size`` bytes: the header and body, then zeros."""
        written = self._written
        if len(written) < self.size:
            # a new buffer, not an extended one: a round may still hold a view of this one
            written = self._written = written + bytes(self.size - len(written))
        return written

    def used_row(self) -> memoryview:
        """The slot's header and body, in place (a round that copies only those sends this)."""
        return memoryview(self._written)[: SLOT.size + self.body_len]

    def seal(self, status: int, body: Any) -> None:
        """Put ``body`` after the slot's header, with ``status``."""
        self._seal(status, self._put(SLOT.size, body) - SLOT.size)

    def body(self) -> bytes:
        """The slot's body (a failed slot's body is the error's text)."""
        return bytes(self._written[SLOT.size : SLOT.size + self.body_len])

    def used(self) -> bytes:
        """The slot's header and body, without the unused rest."""
        return bytes(self._written[: SLOT.size + self.body_len])

    def _put(self, pos: int, data: Any) -> int:
        end = pos + len(data)
        written = self._written
        if len(written) < pos:  # (a slice past the end would append at the end)
            written.extend(bytes(pos - len(written)))
        written[pos:end] = data
        return end

    def fail(self, exc: BaseException, status: int = FAILED) -> None:
        self.error = exc
        room = self.size - SLOT.size
        text = f"{type(exc).__name__}: {exc}".encode(errors="replace")[:room]
        self._seal(status, self._put(SLOT.size, text) - SLOT.size)

    def payload(self, payload: Payload) -> None:
        header, buffers = payload
        for b in buffers:
            if not isinstance(b, torch.Tensor) or b.dtype != torch.uint8 or b.dim() != 1:
                raise TypeError("a serializer's buffers must be 1-D uint8 tensors")
        sizes = [len(header), *(b.numel() for b in buffers)]
        meta = table_bytes(sizes)
        offsets, end = layout(sizes, SLOT.size + len(meta))
        if end <= self.size:
            self._put(SLOT.size, meta)
            self._put(offsets[0], header)
            for pos, b in zip(offsets[1:], buffers):
                if b.numel():
                    self._put(pos, host_bytes(b))
            self._seal(INLINE, end - SLOT.size)
            return
        self.segments, self.sizes = [uint8_view(header), *buffers], sizes
        if SLOT.size + len(meta) <= self.size:
            self._seal(TABLE, self._put(SLOT.size, meta) - SLOT.size)
        else:
            self.meta = meta
            body = PACKED_HEAD.pack(len(meta), layout(sizes)[1])
            self._seal(PACKED, self._put(SLOT.size, body) - SLOT.size)


class ReceivedSlots:
    """Every rank's slot, as gathered in round one (in host memory).

    Examples:
        >>> read_slots(torch.zeros(8192, dtype=torch.uint8), 4096, 2).status(1) == EMPTY
        True
    """

    def __init__(self, host: torch.Tensor, raw: Any, slot_size: int, world: int):
        self.host = host  # a CPU uint8 tensor over ``raw``
        self.raw = memoryview(raw)
        self.slot_size = slot_size
        self.heads = [SLOT.unpack_from(self.raw, r * slot_size) for r in range(world)]

    def status(self, r: int) -> int:
        return self.heads[r][0]

    def body(self, r: int) -> memoryview:
        start = r * self.slot_size + SLOT.size
        return self.raw[start : start + self.heads[r][5]]

    def sizes(self, r: int) -> list[int]:
        """The segment sizes in a TABLE slot."""
        return read_table(self.raw, r * self.slot_size + SLOT.size)

    def inline(self, r: int) -> tuple[memoryview, list[torch.Tensor]]:
        """Header and buffers of an INLINE payload: views of the gathered slots."""
        base = r * self.slot_size
        sizes = read_table(self.raw, base + SLOT.size)
        offsets, _ = layout(sizes, SLOT.size + TABLE_HEAD.size + 8 * (len(sizes) - 1))
        header = self.raw[base + offsets[0] : base + offsets[0] + sizes[0]]
        buffers = [self.host[base + o : base + o + n] for o, n in zip(offsets[1:], sizes[1:])]
        return header, buffers


def read_slots(received: torch.Tensor, slot_size: int, count: int) -> ReceivedSlots:
    """``count`` slots received in one uint8 tensor (on any device), readable here.

    Examples:
        >>> read_slots(torch.zeros(4096, dtype=torch.uint8), 4096, 1).status(0)
        0
    """
    host = received if received.device.type == "cpu" else received.cpu()
    return ReceivedSlots(host, host.numpy(), slot_size, count)


def split_blob(blob: torch.Tensor, sizes: Sequence[int]) -> tuple[Any, list[torch.Tensor]]:
    """A received blob's header (host bytes) and buffers (views of the blob).

    Examples:
        >>> header, buffers = split_blob(torch.zeros(48, dtype=torch.uint8), [12, 20])
        >>> len(header), [b.numel() for b in buffers]
        (12, [20])
    """
    offsets, _ = layout(sizes)
    if blob.is_cpu:  # one view of the whole blob: no tensor op for the header
        header = host_bytes(blob)[offsets[0] : offsets[0] + sizes[0]]
    else:
        header = host_bytes(blob[offsets[0] : offsets[0] + sizes[0]])
    buffers = [blob[o : o + n] for o, n in zip(offsets[1:], sizes[1:])]
    return header, buffers


def root_field(rank: Any) -> int:
    """``src``/``dst`` as the slot's int32 field; anything invalid becomes -2.

    The invalid value is reported by the argument check, not by ``struct``.

    Examples:
        >>> root_field(3), root_field("0"), root_field(2**40)
        (3, -2, -2)
    """
    if isinstance(rank, int) and not isinstance(rank, bool) and -(2**31) <= rank < 2**31:
        return rank
    return -2


def prepare(
    slot_size: int,
    op: int,
    root: int,
    aux: int,
    obj: Any,
    ser: Serializer,
    serialize: bool,
    arg_check: Callable[[], object] | None = None,
) -> Outgoing:
    """A rank's slot for ``op``: ``arg_check``'s refusal, or ``obj`` serialized if ``serialize``.

    A refused argument (``TypeError``/``ValueError`` from ``arg_check``) makes a
    ``BAD_ARGUMENT`` slot, a failed serialization a ``FAILED`` one: the other
    ranks read either in round one and raise with this rank.

    Examples:
        >>> prepare(4096, GATHER, 0, 0, [1, 2], serializer, True).status == INLINE
        True
        >>> def refuse():
        ...     raise ValueError("dst out of range")
        >>> prepare(4096, GATHER, 9, 0, None, serializer, False, refuse).status == BAD_ARGUMENT
        True
    """
    out = Outgoing(slot_size, op, root, aux)
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
