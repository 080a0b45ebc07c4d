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
import weakref
from typing import TYPE_CHECKING, Any

import torch

from commlib._rooms import HEADER, Rooms
from commlib.dtypes import byte_view, dtype_code, dtype_from_code
from commlib.errors import RemoteArgumentError

if TYPE_CHECKING:
    import datetime

    from commlib._engine import Engine

MAX_DIMS = 31
_HEADER = 36  # int64 fields: ok, dtype, ndim, nbytes, dims...; 288 bytes keeps data aligned
_HEADER_BYTES = _HEADER * 8
assert _HEADER_BYTES == HEADER


# this rank's outgoing slot per engine, in host memory, reused call after call:
# the engine's collective has read it before exchange returns
_own: weakref.WeakKeyDictionary[Any, tuple[bytearray, torch.Tensor]] = weakref.WeakKeyDictionary()


def _own_slot(engine: Engine, size: int) -> tuple[bytearray, torch.Tensor]:
    found = _own.get(engine)
    if found is None or len(found[0]) != size:
        raw = bytearray(size)
        found = _own[engine] = (raw, torch.frombuffer(raw, dtype=torch.uint8))
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
    slot, mine = _own_slot(engine, size)
    struct.pack_into(f"<{len(fields)}q", slot, 0, *fields)
    if ok and 0 < nbytes <= room:
        mine.narrow(0, _HEADER_BYTES, nbytes).copy_(byte_view(tensor))
    world = engine.world_size
    mine = engine.plugin.to_device(mine)
    if mine.device.type == "cpu":
        raw: bytearray | bytes = bytearray(world * size)
        gathered = torch.frombuffer(raw, dtype=torch.uint8)
    else:
        gathered = torch.empty(world * size, dtype=torch.uint8, device=mine.device)
    engine.run(what, engine.plugin.all_gather_into_tensor, gathered, mine, timeout=timeout)
    if mine.device.type != "cpu":
        raw = gathered.view(world, size)[:, :_HEADER_BYTES].cpu().numpy().tobytes()
        stride = _HEADER_BYTES
    else:
        stride = size
    heads = [struct.unpack_from(f"<{_HEADER}q", raw, r * stride) for r in range(world)]
    rows = gathered.view(world, size)

    if not all(h[0] for h in heads):
        bad = {r: f"tensor has more than {MAX_DIMS} dims" for r, h in enumerate(heads) if not h[0]}
        raise RemoteArgumentError(what, bad)
    if len({(h[1], h[2]) for h in heads}) > 1:
        per_rank = {r: f"dtype={dtype_from_code(h[1])}, ndim={h[2]}" for r, h in enumerate(heads)}
        raise RemoteArgumentError(what, per_rank, "ranks passed different dtypes or ndims")
    shapes = [list(h[4 : 4 + h[2]]) for h in heads]
    if rooms is not None:
        rooms.learn(max(h[3] for h in heads), world)
    if any(h[3] > room for h in heads):
        return shapes, None
    if nbytes and all(s == shapes[0] for s in shapes):  # equal shapes: one view of them all
        block = rows.narrow(1, _HEADER_BYTES, nbytes).view(tensor.dtype)
        return shapes, list(block.view(world, *shapes[0]).unbind(0))
    tensors = [
        rows[r].narrow(0, _HEADER_BYTES, h[3]).view(tensor.dtype).reshape(shapes[r])
        for r, h in enumerate(heads)
    ]
    return shapes, tensors
