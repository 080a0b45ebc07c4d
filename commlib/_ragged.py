"""Gathering tensors whose shapes may differ across ranks.

Ranks cannot know each other's shapes without asking, so the first round is a
fixed-size slot per rank: a header (status, dtype, shape, byte count) and, when
the tensor is small enough, the tensor's bytes too. Small tensors therefore
complete in that one round; larger ones follow in a second, padded all_gather.
A dtype or ndim that differs across ranks raises the same error everywhere.

The slot's room for data is learnt (:mod:`commlib._rooms`, shared with the
argument check): a loop gathering tensors of steady shapes completes each call
in one round from its second call on; the byte count of every round is still
the same on every rank, so no engine ever sees ranks disagree on a size.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import torch

from commlib._rooms import HEADER, Rooms
from commlib._sent_slots import SentSlot, copies_of
from commlib.dtypes import dtype_code, dtype_from_code
from commlib.errors import RemoteArgumentError

if TYPE_CHECKING:
    import datetime

    from commlib._engine import Engine

MAX_DIMS = 31
_HEADER = 36  # int64 fields: ok, dtype, ndim, nbytes, dims...; 288 bytes keeps data aligned
_HEADER_BYTES = _HEADER * 8
assert _HEADER_BYTES == HEADER


# gathered slots up to this many bytes land in a bytearray, larger ones in torch.empty
_ZEROED_UP_TO = 64 << 10
_HEADS = struct.Struct(f"<{_HEADER}q")
_FIELDS = [struct.Struct(f"<{n}q") for n in range(4 + MAX_DIMS + 1)]


def _own_slot(engine: Engine, size: int) -> SentSlot:
    found: SentSlot | None = engine.kept.get("ragged")
    if found is None or found.size != size:
        copies = copies_of(engine.world_size, size, engine.on_cpu)
        found = engine.kept["ragged"] = SentSlot(copies, size, _HEADER_BYTES)
    return found


def inline_room(slot_size: int) -> int:
    """Bytes of tensor data a slot of ``slot_size`` bytes carries after its header.

    Examples:
        >>> inline_room(4096)
        3808
    """
    return max(0, slot_size - _HEADER_BYTES) // 16 * 16


def exchange(
    engine: Engine,
    tensor: torch.Tensor,
    what: str,
    *,
    room: int,
    timeout: datetime.timedelta | None = None,
    rooms: Rooms | None = None,
) -> tuple[list[list[int]], list[torch.Tensor] | None]:
    """Every rank's shape, and every rank's tensor if all fit ``room`` bytes.

    ``tensor`` must be contiguous and on the backend's device. With
    ``room=0`` only shapes travel (a 288-byte slot per rank). With
    ``rooms``, the slot has the room it learnt (at least ``room``), and
    learns from this call.

    Examples:
        >>> shapes, tensors = exchange(engine, torch.ones(2), "all_gather", room=3808)
        >>> shapes             # on 2 ranks, rank 1 passing torch.ones(3): [[2], [3]]
        [[2]]
    """
    ok = tensor.dim() <= MAX_DIMS
    nbytes = tensor.numel() * tensor.element_size()
    size = _HEADER_BYTES + room
    if rooms is not None:
        size = rooms.slot_bytes(size)
        room = size - _HEADER_BYTES
    fields = [int(ok), dtype_code(tensor.dtype), tensor.dim(), nbytes]
    fields += list(tensor.shape) if ok else []
    # plain bytes and struct: a handful of tiny torch ops would cost more than the wire
    own = _own_slot(engine, size)
    own.head(_FIELDS[len(fields)].pack(*fields))
    if ok and 0 < nbytes <= room:
        own.areas(tensor, nbytes).every.copy_(tensor)  # into every row at once
    world = engine.world_size
    on_cpu = engine.on_cpu
    raw: Any
    if on_cpu and world * size <= _ZEROED_UP_TO:
        raw = bytearray(world * size)  # small: the cheapest buffer to read headers from
        gathered = torch.frombuffer(raw, dtype=torch.uint8)
    else:
        # not zeroed: the round fills every byte, and zeroing megabytes costs
        gathered = torch.empty(world * size, dtype=torch.uint8, device=engine.device())
        raw = gathered.numpy() if on_cpu else None
    if on_cpu:
        engine.run(what, engine.plugin.all_gather_slots, gathered, own.rows, timeout=timeout)
    else:
        mine = engine.plugin.to_device(own.rows[0])
        engine.run(what, engine.plugin.all_gather_into_tensor, gathered, mine, timeout=timeout)
    if raw is not None:
        stride = size
    else:
        raw = gathered.view(world, size)[:, :_HEADER_BYTES].cpu().numpy().tobytes()
        stride = _HEADER_BYTES
    heads = [_HEADS.unpack_from(raw, r * stride) for r in range(world)]

    if not all(h[0] for h in heads):
        bad = {r: f"tensor has more than {MAX_DIMS} dims" for r, h in enumerate(heads) if not h[0]}
        raise RemoteArgumentError(what, bad)
    if len({(h[1], h[2]) for h in heads}) > 1:
        per_rank = {r: _said(h) for r, h in enumerate(heads)}
        raise RemoteArgumentError(what, per_rank, "ranks passed different dtypes or ndims")
    shapes = [list(h[4 : 4 + h[2]]) for h in heads]
    if rooms is not None:
        rooms.learn(max(h[3] for h in heads), world)
    if any(h[3] > room for h in heads):
        return shapes, None
    if nbytes and all(s == shapes[0] for s in shapes):  # equal shapes: one view of them all
        block = gathered.as_strided((world, nbytes), (size, 1), _HEADER_BYTES).view(tensor.dtype)
        return shapes, list(block.view(world, *shapes[0]).unbind(0))
    rows = gathered.view(world, size)
    tensors = [
        rows[r].narrow(0, _HEADER_BYTES, h[3]).view(tensor.dtype).reshape(shapes[r])
        for r, h in enumerate(heads)
    ]
    return shapes, tensors


def _said(head: tuple[int, ...]) -> str:
    """What a rank's header says it passed; a slot of another protocol says nothing."""
    dtype = dtype_from_code(head[1])
    if isinstance(dtype, str) or not 0 <= head[2] <= MAX_DIMS:
        return "another collective"
    return f"dtype={dtype}, ndim={head[2]}"
