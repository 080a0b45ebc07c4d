"""``scatter_object_list``: ``src``'s ``i``-th object to rank ``i``, on the object slots.

Round one is that of the other object collectives (:mod:`commlib._objects`,
on the slots of :mod:`commlib._slots`): an all_gather of one slot per rank,
so every rank's arguments and ``src``'s serialization are agreed on and a
failure anywhere is raised by every rank.
``src`` serializes each object on its own into a slot of its own (a "part").
When every part fits in ``src``'s round-one slot, the parts travel in it and
the call completes in that one round. Otherwise round two scatters the parts
(one slot per rank), and a part too large for its slot follows as payloads
do in the other collectives: by send/recv from ``src`` (``"p2p"`` transport)
or by a scatter padded to the largest (``"collective"``).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import torch

from commlib import _validation as check
from commlib._objects import (
    agree,
    load_payload,
    outgoing_messages,
    pack_blob,
    round_one,
    transfer_p2p,
)
from commlib._rooms import rooms_of
from commlib._slots import (
    ALIGN,
    BAD_ARGUMENT,
    EMPTY,
    INLINE,
    OP_NAMES,
    PACKED,
    PACKED_HEAD,
    SCATTER,
    SLOT,
    TABLE,
    Outgoing,
    host_bytes,
    layout,
    read_slots,
    read_table,
    root_field,
    split_blob,
)
from commlib._steps import Steps, call
from commlib.serialization import Serializer, uint8_view

if TYPE_CHECKING:
    from commlib._engine import Engine

WHAT = OP_NAMES[SCATTER]
_INDEX = struct.Struct("<II")  # where one part lies in src's round-one body: offset, length
_LARGEST = struct.Struct("<QQ")  # the largest table and the largest blob among the parts


def _pack(out: Outgoing, parts: list[Outgoing]) -> bool:
    """Put every part in ``out``'s body (an index, then the parts); False if they do not fit."""
    if any(p.status not in (INLINE, EMPTY) for p in parts):
        return False
    used = [p.used() for p in parts]
    body = bytearray(len(parts) * _INDEX.size)
    for i, part in enumerate(used):
        body += bytes(-len(body) % ALIGN)
        _INDEX.pack_into(body, i * _INDEX.size, len(body), len(part))
        body += part
    if SLOT.size + len(body) > out.size:
        return False
    out.seal(INLINE, body)
    return True


def _unpack(slots: Any, src: int, me: int, slot_size: int) -> Any:
    """This rank's part from ``src``'s round-one body, as a slot of its own."""
    body = slots.body(src)
    offset, length = _INDEX.unpack_from(body, me * _INDEX.size)
    part = bytearray(slot_size)
    part[:length] = body[offset : offset + length]
    return read_slots(torch.frombuffer(part, dtype=torch.uint8), slot_size, 1)


def _prepare_src(
    out: Outgoing, objects: list[Any], me: int, ser: Serializer, slot_size: int
) -> list[Outgoing]:
    """Serialize each object into a part; fill ``out`` with them or with their largest sizes."""
    parts = [Outgoing(slot_size, SCATTER, out.head[1], 0) for _ in objects]
    for r, obj in enumerate(objects):
        if r != me:  # src keeps its own object as it is
            parts[r].payload(ser.dumps(obj))
    if not _pack(out, parts):
        large = [p for p in parts if p.status in (TABLE, PACKED)]
        table = max((len(p.meta) for p in large), default=0)
        blob = max((layout(p.sizes)[1] for p in large), default=0)
        out.seal(TABLE, _LARGEST.pack(table, blob))
    return parts


def scatter_object_list_steps(
    engine: Engine,
    output_list: Any,
    input_list: Any,
    src: int,
    ser: Serializer,
    slot_size: int,
) -> Steps[None]:
    """See :meth:`commlib.Communicator.scatter_object_list`.

    Examples:
        >>> from commlib._steps import run
        >>> box = [None]
        >>> objs = [{"shard": i} for i in range(engine.world_size)]
        >>> run(engine, scatter_object_list_steps(engine, box, objs, 0, serializer, 4096))
        >>> box                         # on rank 1 of 2: [{'shard': 1}]
        [{'shard': 0}]
    """
    world, me = engine.world_size, engine.rank
    out = Outgoing(slot_size, SCATTER, root_field(src), 0)
    parts: list[Outgoing] = []
    try:
        check_arguments(output_list, input_list, src, world, me)
    except (TypeError, ValueError) as exc:
        out.fail(exc, BAD_ARGUMENT)
    else:
        if me == src:
            try:
                parts = _prepare_src(out, list(input_list), me, ser, slot_size)
            except Exception as exc:
                out.fail(exc)
    slots = yield from round_one(engine, out, world)
    agree(slots, SCATTER)
    rooms_of(engine).learn(0, world)  # each rank needs its part alone: padding only costs
    if me == src:
        output_list[0] = input_list[src]
    if slots.status(src) == INLINE:
        if me != src:
            header, buffers = _unpack(slots, src, me, slot_size).inline(0)
            output_list[0] = load_payload(ser, me, src, header, buffers)
        return None
    # round two: one slot per rank; then the parts that did not fit theirs
    dev = engine.device()
    mine = torch.empty(slot_size, dtype=torch.uint8, device=dev)
    sent = [engine.to_device(torch.frombuffer(p.slot, dtype=torch.uint8)) for p in parts]
    yield from call(engine, WHAT, "scatter", mine, sent if me == src else None, src)
    largest_table, largest_blob = _LARGEST.unpack_from(slots.body(src))
    if engine.large_payload_transport == "p2p":
        received = yield from _rest_p2p(engine, src, parts, mine, slot_size)
    else:
        received = yield from _rest_collective(
            engine, src, parts, mine, slot_size, largest_table, largest_blob
        )
    if me != src:
        output_list[0] = load_payload(ser, me, src, *received)
    return None


def check_arguments(output_list: Any, input_list: Any, src: Any, world: int, me: int) -> None:
    """The checks every rank makes before round one (``input_list`` only on ``src``).

    Examples:
        >>> check_arguments([None], None, 0, 2, 1)
    """
    if not isinstance(output_list, list) or not output_list:
        raise (ValueError if isinstance(output_list, list) else TypeError)(
            f"{WHAT} needs a non-empty output list to fill, got {output_list!r:.40}"
        )
    check.rank_in_range(src, world, "src")
    if me != src:
        return
    if not isinstance(input_list, (list, tuple)):
        raise TypeError(f"{WHAT} needs a list of objects on src, got {type(input_list).__name__}")
    if len(input_list) != world:
        raise ValueError(
            f"{WHAT} needs one object per rank on src ({world}), got {len(input_list)}"
        )


def _rest_p2p(
    engine: Engine, src: int, parts: list[Outgoing], mine: torch.Tensor, slot_size: int
) -> Steps[Any]:
    """Parts that did not fit their slot, by send/recv from ``src``; (header, buffers) here."""
    me = engine.rank
    if me == src:
        packed = [r for r, p in enumerate(parts) if p.status == PACKED]
        table_sends = [(engine.to_device(uint8_view(parts[r].meta)), r) for r in packed]
        if table_sends:
            yield from call(engine, WHAT, "exchange", table_sends, [])
        sends = [
            (msg, r)
            for r, p in enumerate(parts)
            if p.status in (TABLE, PACKED)
            for msg in outgoing_messages(engine, p.segments, p.sizes)
        ]
        if sends:
            yield from call(engine, WHAT, "exchange", sends, [])
        return None
    part = read_slots(mine, slot_size, 1)
    if part.status(0) == INLINE:
        return part.inline(0)
    if part.status(0) == PACKED:
        table_len = PACKED_HEAD.unpack_from(part.body(0))[0]
        tables = yield from transfer_p2p(engine, [(src, me)], {src: [table_len]}, [], WHAT)
        sizes = read_table(host_bytes(tables[src]))
    else:
        sizes = part.sizes(0)
    blobs = yield from transfer_p2p(engine, [(src, me)], {src: sizes}, [], WHAT)
    return split_blob(blobs[src], sizes)


def _rest_collective(
    engine: Engine,
    src: int,
    parts: list[Outgoing],
    mine: torch.Tensor,
    slot_size: int,
    largest_table: int,
    largest_blob: int,
) -> Steps[Any]:
    """Parts that did not fit their slot, by scatters padded to the largest."""
    me, dev = engine.rank, engine.device()
    part = read_slots(mine, slot_size, 1) if me != src else None
    status = part.status(0) if part is not None else None
    sizes: list[int] = part.sizes(0) if part is not None and status == TABLE else []
    if largest_table:
        table = torch.zeros(largest_table, dtype=torch.uint8, device=dev)
        sent = None
        if me == src:
            sent = [torch.zeros_like(table) for _ in parts]
            for t, p in zip(sent, parts):
                t[: len(p.meta)].copy_(uint8_view(p.meta))
        yield from call(engine, WHAT, "scatter", table, sent, src)
        if status == PACKED:
            sizes = read_table(host_bytes(table))
    blob = torch.zeros(largest_blob, dtype=torch.uint8, device=dev)
    if largest_blob:  # else every part fitted a slot of its own
        blobs = None
        if me == src:
            blobs = [
                pack_blob(engine, p.segments, p.sizes, largest_blob)
                if p.status in (TABLE, PACKED)
                else torch.zeros_like(blob)
                for p in parts
            ]
        yield from call(engine, WHAT, "scatter", blob, blobs, src)
    if part is None:
        return None
    if status == INLINE:
        return part.inline(0)
    return split_blob(blob, sizes)
