"""Objects point to point: ``send_object_list`` and ``recv_object_list``.

The sender's first message is one slot (the communicator's ``slot_size``, as
in the object collectives, :mod:`commlib._slots`): its status, the list
length and, when it fits, the serialized list. A list that does not fit
follows by send/recv: its table of segment sizes (first, when even that does
not fit the slot), then the segments, large buffers straight from the
object's memory.

A sender that cannot serialize its list (or was not given one) still sends
its slot, marked failed, and then raises: the receiver raises the same error
at once instead of waiting for a payload that never comes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from commlib._objects import (
    load_payload,
    transfer_p2p,
)
from commlib._slots import (
    BAD_ARGUMENT,
    FAILED,
    INLINE,
    OP_NAMES,
    PACKED,
    PACKED_HEAD,
    SEND,
    TABLE,
    host_bytes,
    prepare,
    read_slots,
    read_table,
    split_blob,
)
from commlib._steps import Steps, call
from commlib.errors import CommError, RemoteArgumentError, RemoteError
from commlib.serialization import Serializer, uint8_view

if TYPE_CHECKING:
    from commlib._engine import Engine

WHAT = OP_NAMES[SEND]


def _failure(status: int, sender: int, text: str) -> RemoteError:
    """The error both ends raise for a failed send: a bad argument or a failed serialization."""
    kind = RemoteArgumentError if status == BAD_ARGUMENT else RemoteError
    return kind(WHAT, {sender: text})


def _list_length(objects: Any) -> int:
    if not isinstance(objects, list):
        raise TypeError(f"{WHAT} needs a list, got {type(objects).__name__}")
    return len(objects)


def send_object_list_steps(
    engine: Engine, objects: Any, dst: int, ser: Serializer, slot_size: int
) -> Steps[None]:
    """See :meth:`commlib.Communicator.send_object_list`.

    Examples:
        >>> from commlib._steps import run
        >>> if engine.world_size > 1:         # rank 1 calls recv_object_list(engine, box, 0, ...)
        ...     run(engine, send_object_list_steps(engine, [{"step": 3}], 1, serializer, 4096))
    """
    me = engine.rank
    length = len(objects) if isinstance(objects, list) else -1
    out = prepare(slot_size, SEND, me, length, objects, ser, True, lambda: _list_length(objects))
    slot = engine.to_device(torch.frombuffer(out.slot, dtype=torch.uint8))
    yield from call(engine, WHAT, "send", slot, dst)
    if out.status in (FAILED, BAD_ARGUMENT):
        raise _failure(out.status, me, out.body().decode(errors="replace")) from out.error
    if out.status == PACKED:
        meta = [uint8_view(out.meta)]
        yield from transfer_p2p(engine, [(me, dst)], {me: [len(out.meta)]}, meta, WHAT)
    if out.status in (TABLE, PACKED):
        yield from transfer_p2p(engine, [(me, dst)], {me: out.sizes}, out.segments, WHAT)


def recv_object_list_steps(
    engine: Engine, objects: Any, src: int, ser: Serializer, slot_size: int
) -> Steps[int]:
    """See :meth:`commlib.Communicator.recv_object_list`; returns ``src``.

    The whole message is received before ``objects`` is checked, so a wrong
    list here never leaves the sender blocked.

    Examples:
        >>> from commlib._steps import run
        >>> box = [None]
        >>> if engine.rank == 1:
        ...     run(engine, recv_object_list_steps(engine, box, 0, serializer, 4096))   # 0
    """
    me = engine.rank
    received = torch.empty(slot_size, dtype=torch.uint8, device=engine.device())
    yield from call(engine, "recv_object_list", "recv", received, src)
    slots = read_slots(received, slot_size, 1)
    status, op, _, _, length, _ = slots.heads[0]
    if op != SEND:
        raise CommError(
            f"recv_object_list on rank {me}: what rank {src} sent is not an object list "
            "(a tensor send, or a different slot_size on the two ranks?)"
        )
    if status in (FAILED, BAD_ARGUMENT):
        raise _failure(status, src, bytes(slots.body(0)).decode(errors="replace"))
    if status == INLINE:
        header, buffers = slots.inline(0)
    else:
        if status == PACKED:
            table_len = PACKED_HEAD.unpack_from(slots.body(0))[0]
            tables = yield from transfer_p2p(engine, [(src, me)], {src: [table_len]}, [], WHAT)
            sizes = read_table(host_bytes(tables[src]))
        elif status == TABLE:
            sizes = slots.sizes(0)
        else:
            raise CommError(f"recv_object_list on rank {me}: rank {src} sent status {status}")
        blobs = yield from transfer_p2p(engine, [(src, me)], {src: sizes}, [], WHAT)
        header, buffers = split_blob(blobs[src], sizes)
    loaded = load_payload(ser, me, src, header, buffers)
    if not isinstance(objects, list):
        raise TypeError(f"recv_object_list needs a list, got {type(objects).__name__}")
    if len(objects) != length:
        raise ValueError(
            f"recv_object_list got a list of {len(objects)} on rank {me}, but rank {src} "
            f"sent {length} objects; pass a list of that length"
        )
    objects[:] = loaded
    return src
