"""Object collectives, written once on top of the backends' tensor collectives.

Round one: every rank contributes a fixed-size *slot* (``Communicator.slot_size``
bytes) to one ``all_gather_into_tensor``. A slot carries the rank's status
(ok, failed, nothing to send), which collective it is in, its ``src``/``dst``
and, when the serialized object fits, the object itself. So:

* small objects complete in this one round;
* a rank that failed to serialize (or passed a bad argument) tells everyone in
  the same round, and every rank raises the same :class:`RemoteError`;
* ranks that disagree on the collective, ``src``/``dst`` or list length find
  out before any payload moves.

Round two runs only when some payload did not fit: its table of buffer sizes
travels in the slot and the buffers follow through the backend's
``large_payload_transport``: ``"p2p"`` (send/recv to exactly the ranks that
need it, buffers sent straight from the object's memory) or ``"collective"``
(one padded all_gather / gather / broadcast).
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from commlib import validation as check
from commlib.errors import DeserializationError, RemoteArgumentError, RemoteError
from commlib.serialization import Payload, Serializer

if TYPE_CHECKING:
    from commlib.communicator import Communicator

# slot: status, collective, reserved, root (src/dst or -1), aux (list length), body length
_SLOT = struct.Struct("<BBHiqQ")
_META = struct.Struct("<QI")  # header length, number of buffers

EMPTY, INLINE, TABLE, PACKED, FAILED, BAD_ARGUMENT = range(6)
ALL_GATHER, GATHER, BROADCAST = 1, 2, 3
_OP_NAMES = {
    ALL_GATHER: "all_gather_object",
    GATHER: "gather_object",
    BROADCAST: "broadcast_object_list",
}

# round two: buffers below SMALL are coalesced into messages of up to CAP bytes
SMALL, CAP = 1 << 18, 1 << 20


class _Slot:
    """One rank's decoded slot."""

    __slots__ = ("aux", "body", "op", "root", "status")

    def __init__(self, raw: np.ndarray):
        self.status, self.op, _, self.root, self.aux, n = _SLOT.unpack_from(raw, 0)
        self.body = raw[_SLOT.size : _SLOT.size + n]

    def sizes(self) -> list[int]:
        """Segment sizes (header, then buffers) of an INLINE or TABLE payload."""
        header_len, count = _META.unpack_from(self.body, 0)
        return [header_len, *struct.unpack_from(f"<{count}Q", self.body, _META.size)]

    def blob_size(self) -> int:
        if self.status == TABLE:
            return sum(self.sizes())
        if self.status == PACKED:
            return struct.unpack_from("<Q", self.body, 0)[0]
        return 0

    def messages(self) -> list[int]:
        """Sizes of the round-two messages this payload is sent as."""
        if self.status == PACKED:
            return [self.blob_size()]
        return [sum(self.sizes()[i] for i in g) for g in _coalesce(self.sizes())]


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


def _bytes_tensor(data: bytes | bytearray | memoryview) -> torch.Tensor:
    if len(data) == 0:
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only memory is only ever read here
        return torch.frombuffer(data, dtype=torch.uint8)


class _Outgoing:
    """A rank's slot for round one and, if needed, its messages for round two."""

    def __init__(self, slot_size: int, op: int, root: int, aux: int):
        self.slot = torch.zeros(slot_size, dtype=torch.uint8)
        self.op, self.root, self.aux = op, root, aux
        self.segments: list[torch.Tensor] = []
        self.status = EMPTY
        self._write(EMPTY, b"")

    def _write(self, status: int, body: bytes | list[torch.Tensor]) -> None:
        self.status = status
        view = self.slot.numpy()
        if isinstance(body, (bytes, bytearray)):
            n = len(body)
            view[_SLOT.size : _SLOT.size + n] = np.frombuffer(body, dtype=np.uint8)
        else:
            n, pos = 0, _SLOT.size
            for part in body:
                k = part.numel()
                self.slot[pos : pos + k].copy_(part)
                pos += k
                n += k
        _SLOT.pack_into(view, 0, status, self.op, 0, self.root, self.aux, n)

    def fail(self, exc: BaseException, status: int = FAILED) -> None:
        room = self.slot.numel() - _SLOT.size
        text = f"{type(exc).__name__}: {exc}".encode(errors="replace")
        self._write(status, text[:room])

    def payload(self, payload: Payload) -> None:
        header, buffers = payload
        for b in buffers:
            if not isinstance(b, torch.Tensor) or b.dtype != torch.uint8 or b.dim() != 1:
                raise TypeError("a serializer's buffers must be 1-D uint8 tensors")
        sizes = [len(header), *(b.numel() for b in buffers)]
        meta = _META.pack(len(header), len(buffers)) + struct.pack(f"<{len(buffers)}Q", *sizes[1:])
        room = self.slot.numel() - _SLOT.size
        segments = [_bytes_tensor(header), *buffers]
        if len(meta) + sum(sizes) <= room:
            self._write(INLINE, [_bytes_tensor(meta), *(s.cpu() for s in segments)])
        elif len(meta) <= room:
            self._write(TABLE, meta)
            self.segments = segments
        else:
            self._write(PACKED, struct.pack("<Q", len(meta) + sum(sizes)))
            self.segments = [_bytes_tensor(meta), *segments]

    def messages(self, comm: Communicator) -> list[torch.Tensor]:
        """Round-two messages, on the backend's device."""
        to = comm.plugin.to_device
        if self.status == PACKED:
            groups = [list(range(len(self.segments)))]
        else:
            groups = _coalesce([s.numel() for s in self.segments])
        out = []
        for g in groups:
            parts = [to(self.segments[i]) for i in g]
            msg = parts[0] if len(parts) == 1 else torch.cat(parts)
            if msg.numel():
                out.append(msg)
        return out

    def blob(self, comm: Communicator, size: int) -> torch.Tensor:
        """All segments in one tensor of ``size`` bytes (zero padded)."""
        dev = comm.plugin.device()
        blob = torch.zeros(size, dtype=torch.uint8, device=dev)
        pos = 0
        for s in self.segments:
            blob[pos : pos + s.numel()].copy_(s)
            pos += s.numel()
        return blob


def _round_one(comm: Communicator, out: _Outgoing) -> list[_Slot]:
    world, size = comm.world_size, comm.slot_size
    mine = comm.plugin.to_device(out.slot)
    gathered = torch.empty(world * size, dtype=torch.uint8, device=mine.device)
    comm.plugin.all_gather_into_tensor(gathered, mine, comm.group)
    raw = gathered.cpu().numpy().reshape(world, size)
    return [_Slot(raw[r]) for r in range(world)]


def _agree(slots: list[_Slot], op: int) -> None:
    """Raise on every rank if any rank failed or the ranks disagree."""
    name = _OP_NAMES[op]
    failed = {
        r: bytes(s.body).decode(errors="replace")
        for r, s in enumerate(slots)
        if s.status in (FAILED, BAD_ARGUMENT)
    }
    if failed:
        bad_args = any(s.status == BAD_ARGUMENT for s in slots)
        raise (RemoteArgumentError if bad_args else RemoteError)(name, failed)
    for field, what in (("op", "collective"), ("root", "src/dst"), ("aux", "list length")):
        values = [getattr(s, field) for s in slots]
        if len(set(values)) > 1:
            if field == "op":
                values = [_OP_NAMES.get(v, f"unknown({v})") for v in values]
            per_rank = {r: f"{what}={v}" for r, v in enumerate(values)}
            raise RemoteArgumentError(name, per_rank, f"ranks disagree on the {what}")


def _split(comm: Communicator, slot: _Slot, blob: torch.Tensor | None) -> tuple[Any, list]:
    """(header, buffers) of a payload, from its slot or its round-two blob."""
    if slot.status == INLINE:
        sizes = slot.sizes()
        data = torch.from_numpy(slot.body)
        start = _META.size + 8 * (len(sizes) - 1)
        # the slot lives in host memory; buffers go to the backend's device
        dev = comm.plugin.device()
        blob = data[start:]
        buffers_on = blob if blob.device == dev else comm.plugin.to_device(blob)
        header = memoryview(slot.body[start : start + sizes[0]])
    else:
        assert blob is not None
        if slot.status == PACKED:
            header_len, count = _META.unpack_from(blob[: _META.size].cpu().numpy(), 0)
            meta_len = _META.size + 8 * count
            meta = blob[:meta_len].cpu().numpy()
            sizes = [header_len, *struct.unpack_from(f"<{count}Q", meta, _META.size)]
            blob = blob[meta_len:]
        else:
            sizes = slot.sizes()
        header = memoryview(blob[: sizes[0]].cpu().numpy())
        buffers_on = blob
    buffers, pos = [], sizes[0]
    for n in sizes[1:]:
        buffers.append(buffers_on[pos : pos + n])
        pos += n
    return header, buffers


def _load(ser: Serializer, comm: Communicator, slot: _Slot, blob, sender: int) -> Any:
    try:
        header, buffers = _split(comm, slot, blob)
        return ser.loads(header, buffers)
    except Exception as exc:
        raise DeserializationError(
            f"rank {comm.rank} could not load the object sent by rank {sender}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _exchange(comm: Communicator, out: _Outgoing, slots: list[_Slot], routes) -> dict:
    """Round two over ``routes`` (sender, receiver); returns sender -> blob here."""
    me = comm.rank
    dev = comm.plugin.device()
    if comm.plugin.large_payload_transport == "p2p":
        blobs: dict[int, torch.Tensor] = {}
        recvs, sends = [], []
        for sender, receiver in routes:
            if receiver == me:
                blob = torch.empty(slots[sender].blob_size(), dtype=torch.uint8, device=dev)
                blobs[sender] = blob
                pos = 0
                for n in slots[sender].messages():
                    if n:
                        recvs.append((blob[pos : pos + n], sender))
                    pos += n
        mine = [r for s, r in routes if s == me]
        if mine:
            msgs = out.messages(comm)
            sends = [(m, r) for r in mine for m in msgs]
        comm.plugin.exchange(sends, recvs, comm.group)
        return blobs
    return _exchange_collective(comm, out, slots, routes)


def _exchange_collective(comm: Communicator, out: _Outgoing, slots, routes) -> dict:
    me, world = comm.rank, comm.world_size
    senders = sorted({s for s, _ in routes})
    size = max(slots[s].blob_size() for s in senders)
    receivers = {r for _, r in routes}
    if len(senders) == 1 and receivers == set(range(world)) - {senders[0]}:
        src = senders[0]
        blob = (
            out.blob(comm, size)
            if me == src
            else torch.empty(size, dtype=torch.uint8, device=comm.plugin.device())
        )
        comm.plugin.broadcast(blob, src, comm.group)
        return {} if me == src else {src: blob}
    mine = (
        out.blob(comm, size)
        if me in senders
        else torch.zeros(size, dtype=torch.uint8, device=comm.plugin.device())
    )
    if receivers == set(range(world)) or len(receivers) > 1:
        whole = torch.empty(world * size, dtype=torch.uint8, device=mine.device)
        comm.plugin.all_gather_into_tensor(whole, mine, comm.group)
        parts = whole.view(world, size)
    else:
        (dst,) = receivers
        parts = [torch.empty_like(mine) for _ in range(world)] if me == dst else None
        comm.plugin.gather(mine, parts, dst, comm.group)
        if me != dst:
            return {}
    return {s: parts[s] for s in senders if (s, me) in routes}


def _prepare(
    comm: Communicator,
    op: int,
    root: int,
    aux: int,
    obj: Any,
    ser: Serializer,
    serialize: bool,
    arg_check=None,
) -> _Outgoing:
    out = _Outgoing(comm.slot_size, op, root, aux)
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


def all_gather_object(comm: Communicator, obj: Any, ser: Serializer) -> list[Any]:
    """See :meth:`commlib.Communicator.all_gather_object`."""
    out = _prepare(comm, ALL_GATHER, -1, 0, obj, ser, True)
    slots = _round_one(comm, out)
    _agree(slots, ALL_GATHER)
    me = comm.rank
    routes = [
        (s, r)
        for s, slot in enumerate(slots)
        if slot.status in (TABLE, PACKED)
        for r in range(len(slots))
        if r != s
    ]
    blobs = _exchange(comm, out, slots, routes) if routes else {}
    return [
        obj if r == me else _load(ser, comm, slot, blobs.get(r), r) for r, slot in enumerate(slots)
    ]


def gather_object(comm: Communicator, obj: Any, dst: int, ser: Serializer) -> list[Any] | None:
    """See :meth:`commlib.Communicator.gather_object`."""
    world, me = comm.world_size, comm.rank
    root = dst if isinstance(dst, int) and not isinstance(dst, bool) else -2
    out = _prepare(
        comm, GATHER, root, 0, obj, ser, True, lambda: check.rank_in_range(dst, world, "dst")
    )
    slots = _round_one(comm, out)
    _agree(slots, GATHER)
    routes = [
        (s, dst) for s, slot in enumerate(slots) if s != dst and slot.status in (TABLE, PACKED)
    ]
    blobs = _exchange(comm, out, slots, routes) if routes else {}
    if me != dst:
        return None
    return [
        obj if r == me else _load(ser, comm, slot, blobs.get(r), r) for r, slot in enumerate(slots)
    ]


def broadcast_object_list(comm: Communicator, object_list: Any, src: int, ser: Serializer) -> None:
    """See :meth:`commlib.Communicator.broadcast_object_list`."""
    world, me = comm.world_size, comm.rank
    root = src if isinstance(src, int) and not isinstance(src, bool) else -2
    is_list = isinstance(object_list, list)

    def arg_check() -> None:
        if not is_list:
            raise TypeError(
                f"broadcast_object_list needs a list, got {type(object_list).__name__}"
            )
        check.rank_in_range(src, world, "src")

    aux = len(object_list) if is_list else -1
    out = _prepare(comm, BROADCAST, root, aux, object_list, ser, me == root, arg_check)
    slots = _round_one(comm, out)
    _agree(slots, BROADCAST)
    routes = [(src, r) for r in range(world) if r != src and slots[src].status in (TABLE, PACKED)]
    blobs = _exchange(comm, out, slots, routes) if routes else {}
    if me != src:
        object_list[:] = _load(ser, comm, slots[src], blobs.get(src), src)


_SHAPE_SLOTS = 34  # status, dtype, ndim, up to 31 dims


def agree_on_shapes(comm: Communicator, tensor: torch.Tensor, what: str) -> list[list[int]]:
    """Every rank's shape (one small all_gather); raise everywhere on dtype/ndim mismatch.

    Examples:
        >>> agree_on_shapes(comm, torch.ones(2, 3), "all_gather")
        [[2, 3], [1, 3]]
    """
    from commlib.dtypes import dtype_code, dtype_from_code

    ok = tensor.dim() <= _SHAPE_SLOTS - 3
    head = [int(ok), dtype_code(tensor.dtype), tensor.dim()]
    head += list(tensor.shape)[: _SHAPE_SLOTS - 3] if ok else []
    mine = torch.zeros(_SHAPE_SLOTS, dtype=torch.int64)
    mine[: len(head)] = torch.tensor(head, dtype=torch.int64)
    world = comm.world_size
    mine = comm.plugin.to_device(mine)
    whole = torch.empty(world * _SHAPE_SLOTS, dtype=torch.int64, device=mine.device)
    comm.plugin.all_gather_into_tensor(whole, mine, comm.group)
    rows = whole.view(world, _SHAPE_SLOTS).cpu().tolist()
    if not all(row[0] for row in rows):
        bad = {
            r: f"tensor has more than {_SHAPE_SLOTS - 3} dims"
            for r, row in enumerate(rows)
            if not row[0]
        }
        raise RemoteArgumentError(what, bad)
    if len({(row[1], row[2]) for row in rows}) > 1:
        per_rank = {
            r: f"dtype={dtype_from_code(row[1])}, ndim={row[2]}" for r, row in enumerate(rows)
        }
        raise RemoteArgumentError(what, per_rank, "ranks passed different dtypes or ndims")
    return [row[3 : 3 + row[2]] for row in rows]
