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

The slot's wire format (header, statuses, the table, the aligned layout that
lets the receiver view any dtype without a copy) is :mod:`commlib._slots`.

Each protocol, ``*_steps``, is a generator of steps (:mod:`commlib._steps`):
it runs blocking, or starts with ``async_op=True`` and finishes in its
handle; the plain names (``all_gather_object``) run it blocking.
``scatter_object_list`` (:mod:`commlib._scatter_objects`) and the
point-to-point ``send_object_list`` / ``recv_object_list``
(:mod:`commlib._p2p_objects`) are built from the same slots and transfers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from commlib import _validation as check
from commlib._rooms import need_of, rooms_of
from commlib._shared_rows import set_up_steps
from commlib._slots import (
    ALL_GATHER,
    BAD_ARGUMENT,
    BROADCAST,
    FAILED,
    GATHER,
    INLINE,
    OP_CODES,
    OP_NAMES,
    PACKED,
    PACKED_HEAD,
    SLOT,
    TABLE,
    TABLE_HEAD,
    Outgoing,
    ReceivedSlots,
    host_bytes,
    landing,
    layout,
    messages,
    prepare,
    read_table,
    root_field,
    split_blob,
)
from commlib._steps import Steps, call, run
from commlib.errors import DeserializationError, RemoteArgumentError, RemoteError
from commlib.serialization import (
    RefusedClassError,
    RefusedRemoteClassError,
    Serializer,
    uint8_view,
)

if TYPE_CHECKING:
    from commlib._engine import Engine

# a "p2p" backend's round two goes through one collective while every blob is below this
# (on gloo a message costs a few milliseconds more than a collective round)
P2P_MIN = 1 << 20


def round_one(engine: Engine, out: Outgoing, world: int) -> Steps[ReceivedSlots]:
    """Round one: gather every rank's slot ``out`` (one ``all_gather_into_tensor``).

    Examples:
        >>> from commlib._slots import ALL_GATHER, Outgoing
        >>> slots = run(engine, round_one(engine, Outgoing(4096, ALL_GATHER, -1, 0), 1))
        >>> len(slots.heads)
        1
    """
    size = out.size
    what = OP_NAMES[out.head[0]]
    if engine.on_cpu:
        # not zeroed: every row's bytes that are read were written by the round, and a
        # slot learnt large by a tensor call costs nothing to set up
        gathered = torch.empty(world * size, dtype=torch.uint8)
        raw: Any = gathered.numpy()
        kept = engine.kept
        if "shared" in kept:
            shared = kept["shared"]
        else:  # set up by the engine's first slot round, as steps: an async call's run later
            shared = yield from set_up_steps(engine, what)
        lane = None if shared is None else shared.lane(size, False)
        if lane is None:
            mine = torch.frombuffer(out.slot, dtype=torch.uint8)
            yield from call(engine, what, "all_gather_into_tensor", gathered, mine)
        else:  # every rank on this machine: the round through shared memory, which
            # copies only the bytes written (a slot learnt large by a tensor call pads nothing)
            used = torch.frombuffer(out.used_row(), dtype=torch.uint8)
            yield engine.start_lane(what, lane, gathered, used)
        return ReceivedSlots(gathered, raw, size, world)
    mine = engine.to_device(torch.frombuffer(out.slot, dtype=torch.uint8))
    gathered = torch.empty(world * size, dtype=torch.uint8, device=mine.device)
    yield from call(engine, what, "all_gather_into_tensor", gathered, mine)
    host = gathered.cpu()
    return ReceivedSlots(host, host.numpy(), size, world)


# what a slot of another protocol is (a checked tensor collective, all_gather's first
# round): its bytes at the op's place mean nothing here
_OTHER = "another collective"


def agree(slots: ReceivedSlots, op: int) -> None:
    """Raise on every rank if any rank failed or the ranks disagree.

    Examples:
        >>> from commlib._slots import ALL_GATHER, read_slots
        >>> agree(read_slots(torch.zeros(4096, dtype=torch.uint8), 4096, 1), ALL_GATHER)
    """
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
def outgoing_messages(engine: Engine, segments: list[torch.Tensor], sizes) -> list:
    """The messages :func:`messages` describes, on the backend's device.

    A segment that is a message of its own is sent from its own memory; small
    ones are copied together (with their alignment padding).

    Examples:
        >>> segments = [torch.ones(10, dtype=torch.uint8), torch.ones(20, dtype=torch.uint8)]
        >>> [m.numel() for m in outgoing_messages(engine, segments, [10, 20])]
        [36]
    """
    to = engine.to_device
    offsets, _ = layout(sizes)
    out = []
    for start, end, group in messages(sizes):
        if len(group) == 1:
            out.append(to(segments[group[0]]).contiguous())
            continue
        msg = torch.zeros(end - start, dtype=torch.uint8)
        for i in group:
            pos = offsets[i] - start
            msg[pos : pos + sizes[i]].copy_(segments[i])
        out.append(to(msg))
    return out


def pack_blob(engine: Engine, segments: list[torch.Tensor], sizes, size: int) -> torch.Tensor:
    """All segments at their offsets in one tensor of ``size`` bytes (zero padded).

    Examples:
        >>> segments = [torch.ones(10, dtype=torch.uint8), torch.ones(20, dtype=torch.uint8)]
        >>> int(pack_blob(engine, segments, [10, 20], 64).sum())
        30
    """
    device = engine.device()
    offsets, _ = layout(sizes)
    if device.type == "cpu":
        # Python's memory copies: no tensor op per segment
        raw = bytearray(size)
        view = memoryview(raw)
        for pos, seg, n in zip(offsets, segments, sizes):
            if n:
                view[pos : pos + n] = host_bytes(seg)
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
    me, dev = engine.rank, engine.device()
    blobs: dict[int, torch.Tensor] = {}
    recvs = []
    for sender, receiver in routes:
        if receiver == me:
            blob = landing(layout(sizes[sender])[1], dev)
            blobs[sender] = blob
            recvs += [(blob[start:end], sender) for start, end, _ in messages(sizes[sender])]
    targets = [r for s, r in routes if s == me]
    sends = []
    if targets:
        msgs = outgoing_messages(engine, segments, sizes[me])
        sends = [(m, r) for r in targets for m in msgs]
    yield from call(engine, what, "exchange", sends, recvs)
    return blobs


def _transfer_collective(engine: Engine, routes, sizes, segments, what: str) -> Steps[dict]:
    me, world, dev = engine.rank, engine.world_size, engine.device()
    senders = sorted({s for s, _ in routes})
    receivers = {r for _, r in routes}
    # every rank pads to the same size, so the caller gives every rank every
    # sender's sizes (not only those of the senders it receives from)
    size = max(layout(sizes[s])[1] for s in senders)

    def mine() -> torch.Tensor:
        if me in senders:
            return pack_blob(engine, segments, sizes[me], size)
        return torch.zeros(size, dtype=torch.uint8, device=dev)

    if len(senders) == 1 and receivers == set(range(world)) - {senders[0]}:
        src = senders[0]
        blob = mine() if me == src else torch.empty(size, dtype=torch.uint8, device=dev)
        yield from call(engine, what, "broadcast", blob, src)
        return {} if me == src else {src: blob}
    contribution = mine()
    if len(receivers) > 1:
        whole = torch.empty(world * size, dtype=torch.uint8, device=dev)
        yield from call(engine, what, "all_gather_into_tensor", whole, contribution)
        parts: Any = whole.view(world, size)
    else:
        (dst,) = receivers
        parts = [torch.empty_like(contribution) for _ in range(world)] if me == dst else None
        yield from call(engine, what, "gather", contribution, parts, dst)
        if me != dst:
            return {}
    return {s: parts[s] for s in senders if (s, me) in routes}


def _round_two(
    engine: Engine, out: Outgoing, slots: ReceivedSlots, routes: list[tuple[int, int]]
) -> Steps[dict[int, tuple[Any, list[torch.Tensor]]]]:
    """Move the payloads that did not fit; returns sender -> (header, buffers) here."""
    me = engine.rank
    what = OP_NAMES[out.head[0]]
    senders = {s for s, _ in routes}
    sizes = {s: slots.sizes(s) for s in senders if slots.status(s) == TABLE}
    packed = sorted(s for s in senders if slots.status(s) == PACKED)
    transport = engine.large_payload_transport
    if transport == "p2p":
        # every rank reads the same slots, so every rank chooses the same way
        blob_lengths = [layout(sizes[s])[1] for s in sizes]
        blob_lengths += [PACKED_HEAD.unpack_from(slots.body(s))[1] for s in packed]
        if max(blob_lengths, default=0) < P2P_MIN:
            transport = "collective"
    if packed:
        # the tables that did not fit the slots go first, then the segments
        meta_routes = [(s, r) for s, r in routes if s in packed]
        meta_sizes = {s: [PACKED_HEAD.unpack_from(slots.body(s))[0]] for s in packed}
        mine = [uint8_view(out.meta)] if me in packed else []
        tables = yield from _transfer(engine, meta_routes, meta_sizes, mine, what, transport)
        for s, blob in tables.items():
            sizes[s] = read_table(host_bytes(blob))
        if me in packed:
            sizes[me] = out.sizes
        if transport != "p2p":
            # the collective transport pads to the largest blob: every rank needs it
            for s in packed:
                sizes.setdefault(s, [0, PACKED_HEAD.unpack_from(slots.body(s))[1]])
    blobs = yield from _transfer(engine, routes, sizes, out.segments, what, transport)
    return {s: split_blob(blob, sizes[s]) for s, blob in blobs.items()}


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


def _load(
    ser: Serializer, engine: Engine, slots: ReceivedSlots, received: dict, sender: int
) -> Any:
    if slots.status(sender) == INLINE:
        header, buffers = slots.inline(sender)
    else:
        header, buffers = received[sender]
    return load_payload(ser, engine.rank, sender, header, buffers)


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
    op = OP_CODES[what]
    out = Outgoing(slot_size, op, -1, 0)
    out.fail(error, BAD_ARGUMENT)
    slots = yield from round_one(engine, out, engine.world_size)
    ranks = range(engine.world_size)
    if all(slots.heads[r][:2] == (BAD_ARGUMENT, op) for r in ranks) and (
        len({bytes(slots.body(r)) for r in ranks}) == 1
    ):
        return
    agree(slots, op)


def _need(slots: ReceivedSlots, r: int) -> int:
    """Bytes rank ``r``'s payload needs in a slot (0: none, or too many buffers to count)."""
    status = slots.status(r)
    if status == INLINE:
        return SLOT.size + slots.heads[r][5]
    if status == TABLE:
        sizes = slots.sizes(r)
        return layout(sizes, SLOT.size + TABLE_HEAD.size + 8 * (len(sizes) - 1))[1]
    return 0


def _learn(engine: Engine, slots: ReceivedSlots, world: int) -> None:
    """Let the group's slot learn this call's payloads (the same slots on every rank).

    Only up to ``_rooms.PAD_UP_TO`` (128 KiB): the slot is the first round of
    every collective of the group, and a loop that gathers a large object
    once per step would otherwise pad each of its small checked all_reduces.
    """
    largest = max(_need(slots, r) for r in range(world))
    rooms_of(engine).learn(need_of(largest, everyone_needs_all=False), world)


def _large(slots: ReceivedSlots, world: int) -> list[int]:
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
    out = prepare(slot_size, ALL_GATHER, -1, 0, obj, ser, True)
    slots = yield from round_one(engine, out, world)
    agree(slots, ALL_GATHER)
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
    root = root_field(dst)
    out = prepare(
        slot_size, GATHER, root, 0, obj, ser, True, lambda: check.rank_in_range(dst, world, "dst")
    )
    slots = yield from round_one(engine, out, world)
    agree(slots, GATHER)
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
    root = root_field(src)
    is_list = isinstance(object_list, list)

    def arg_check() -> None:
        if not is_list:
            raise TypeError(
                f"broadcast_object_list needs a list, got {type(object_list).__name__}"
            )
        check.rank_in_range(src, world, "src")

    aux = len(object_list) if is_list else -1
    out = prepare(slot_size, BROADCAST, root, aux, object_list, ser, me == root, arg_check)
    slots = yield from round_one(engine, out, world)
    agree(slots, BROADCAST)
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
