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
_FIELDS = [struct.Struct(f"<{n}q") for n in range(_HEADER + 1)]
_ROOT = _HEADER - 1  # the field after the largest shape: a gather's dst


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

    Examples:
        >>> shapes, tensors, dtype = exchange(engine, torch.ones(2), "all_gather", room=3808)
        >>> shapes             # on 2 ranks, rank 1 passing torch.ones(3): [[2], [3]]
        [[2]]
    """
    ok = tensor.dim() <= MAX_DIMS
    nbytes = tensor.numel() * tensor.element_size()
    gathering = GATHER_ADAPTING if adapt_empty else GATHER
    if dst is not None:
        gathering = GATHER_TO
    status = (SHAPES if shapes_only else gathering) if ok else TOO_MANY_DIMS
    fields = [status, dtype_code(tensor.dtype), tensor.dim(), nbytes]
    fields += list(tensor.shape) if ok else []
    if dst is not None:
        fields += [0] * (_ROOT - len(fields)) + [dst]
    inline = tensor if ok and not shapes_only and 0 < nbytes else None
    size, gathered, heads = _round(engine, what, fields, inline, room, rooms, timeout)
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
        rooms.learn(max(h[3] for h in heads), engine.world_size)
    if any(h[3] > room for h in heads):
        return shapes, None, dtype
    world = engine.world_size
    if nbytes and all(s == shapes[0] for s in shapes):  # equal shapes: one view of them all
        block = gathered.as_strided((world, nbytes), (size, 1), _HEADER_BYTES).view(dtype)
        return shapes, list(block.view(world, *shapes[0]).unbind(0)), dtype
    rows = gathered.view(world, size)
    tensors = [
        rows[r].narrow(0, _HEADER_BYTES, h[3]).view(dtype).reshape(shapes[r])
        for r, h in enumerate(heads)
    ]
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
    fields = [REFUSED, 0, 0, len(text)]
    size, gathered, heads = _round(engine, what, fields, data, room, rooms, timeout)
    texts = {r: _refusal(gathered, size, h, r) for r, h in enumerate(heads)}
    if len(set(texts.values())) > 1:
        _agree(what, heads, gathered, size)


def _round(
    engine: Engine,
    what: str,
    fields: list[int],
    data: torch.Tensor | None,
    room: int,
    rooms: Rooms | None,
    timeout: datetime.timedelta | None,
) -> tuple[int, torch.Tensor, list[tuple[int, ...]]]:
    """One round of slots: its size, what was gathered, and every rank's header fields."""
    size = _HEADER_BYTES + room
    if rooms is not None:
        size = rooms.slot_bytes(size)
    # plain bytes and struct: a handful of tiny torch ops would cost more than the wire
    own = _own_slot(engine, size)
    own.head(_FIELDS[len(fields)].pack(*fields))
    nbytes = 0 if data is None else data.numel() * data.element_size()
    if data is not None and nbytes <= size - _HEADER_BYTES:
        own.areas(data, nbytes).every.copy_(data)  # into every row at once
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
    return size, gathered, [_HEADS.unpack_from(raw, r * stride) for r in range(world)]


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
