"""The argument check of exchanges whose sizes must match pair by pair.

``all_to_all`` of lists of several shapes and ``all_to_all_single`` with split
sizes share no description every rank passes alike: rank ``i`` must send rank
``j`` as many elements as ``j`` expects from ``i``. So each rank's table of
sizes (what it sends each rank, what it expects from each) travels in the
check's round, every rank compares the same pairs of the same tables, and all
raise alike. Where the engine sends row ``j`` of the round to rank ``j`` alone
(:meth:`~commlib.backend.Backend.sends_slot_rows_apart`), the parts ride with
the table: one round for a small exchange instead of the sizes' round and then
the engine's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from commlib import _catalog
from commlib._host_copy import host_copy
from commlib._rooms import HEADER, need_of, rooms_of
from commlib.dtypes import byte_view
from commlib.errors import RemoteArgumentError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from commlib._engine import Engine
    from commlib.types import Timeout


class _Guard(Protocol):
    """What of the communicator's :class:`~commlib._guard.Guard` the pair check uses."""

    slot_size: int
    completed_by_check: frozenset[str]

    def check(
        self,
        engine: Engine,
        what: str,
        describe: Callable[[], str],
        data: torch.Tensor | None = None,
        timeout: Timeout = None,
        *,
        completes: bool = True,
        write: Callable[[torch.Tensor], object] | None = None,
        apart: bool = False,
    ) -> list[torch.Tensor] | None: ...

    def check_pairs(
        self,
        engine: Engine,
        what: str,
        describe: Callable[[], str],
        sends: Sequence[int],
        expects: Sequence[int],
        timeout: Timeout,
    ) -> None: ...


def match_pairs(what: str, table: list[list[int]], world: int) -> None:
    """Raise unless rank ``i`` sends rank ``j`` what ``j`` expects from ``i``, for every pair.

    ``table[r]``: rank ``r``'s elements sent to each rank, then expected from
    each. Every rank holds the same table, so every rank raises alike.

    Examples:
        >>> match_pairs("all_to_all", [[1, 2, 1, 3], [3, 1, 2, 1]], 2)
    """
    wrong = [
        (i, j) for i in range(world) for j in range(world) if table[i][j] != table[j][world + i]
    ]
    if wrong:
        i, j = wrong[0]
        raise RemoteArgumentError(
            what,
            {
                r: f"sends {table[r][:world]} elements, expects {table[r][world:]}"
                for r in range(world)
            },
            f"sizes do not match: rank {i} sends rank {j} {table[i][j]} elements, "
            f"rank {j} expects {table[j][world + i]}",
        )


def riding(
    guard: _Guard,
    engine: Engine,
    what: str,
    describe: Callable[[], str],
    chunks: Sequence[torch.Tensor],
    expects: Sequence[int],
    timeout: Timeout,
) -> list[torch.Tensor] | None:
    """The pair check of ``what`` with each rank's sizes travelling with its parts.

    ``chunks[j]``: what this rank sends rank ``j`` (contiguous, one dtype);
    ``expects[j]``: elements it expects from rank ``j``. Where the engine
    sends row ``j`` of the check's slots to rank ``j`` alone (on the host),
    every row carries this rank's whole table of sizes and, when every chunk
    of this rank fits the rest of the row, the chunk for that row's rank:
    every rank receives every rank's table, so all compare the same pairs and
    raise alike, and where every chunk of every rank fitted, the result is
    every rank's chunk for this rank (flat, in rank order, views valid until
    the engine's next call). Otherwise ``None``, and the caller runs the
    engine's collective; where the rows do not go apart, the table travels in
    a round of its own (``Guard.check_pairs``).

    Examples:
        >>> guard = commlib._guard.Guard("off", frozenset(), serializer, 4096, distributed=False)
        >>> print(riding(guard, engine, "all_to_all", lambda: "", [torch.ones(1)], [1], None))
        None
    """
    world = engine.world_size
    sends = [c.numel() for c in chunks]
    rooms = rooms_of(engine)
    slot = rooms.slot_bytes(guard.slot_size)
    # the room every rank declares alike: what the slot has learnt, so the round
    # teaches it nothing new by itself
    room = slot - HEADER
    table_bytes = 16 * world  # int64 sends and expects: aligned for every dtype
    if (
        what not in guard.completed_by_check
        or not engine.on_cpu
        or room < table_bytes
        or not engine.sends_slot_rows_apart(slot)
    ):
        guard.check_pairs(engine, what, describe, sends, expects, timeout)
        return None
    table = torch.tensor([*sends, *expects], dtype=torch.int64).view(torch.uint8)
    sizes = [c.nbytes for c in chunks]
    fits = max(sizes) <= room - table_bytes

    def write(rows: torch.Tensor) -> None:
        rows[:, :table_bytes].copy_(table)  # into every row at once
        if fits:
            for row, chunk, size in zip(rows.unbind(0), chunks, sizes):
                if size:
                    host_copy(row[table_bytes : table_bytes + size], byte_view(chunk))

    parts = guard.check(
        engine,
        what,
        describe,
        torch.empty(1, room, dtype=torch.uint8).expand(world, room),
        timeout,
        completes=False,
        write=write,
        apart=True,
    )
    if parts is None:  # not carried after all: the sizes in a round of their own
        guard.check_pairs(engine, what, describe, sends, expects, timeout)
        return None
    tables = [p[:table_bytes].view(torch.int64).tolist() for p in parts]
    match_pairs(what, tables, world)
    # every rank's table is known to every rank: all decide alike from here
    item = chunks[0].element_size()
    largest = max(max(t[:world]) for t in tables) * item
    if largest > room - table_bytes:
        need = need_of(table_bytes + largest, what in _catalog.EVERYONE_NEEDS_ALL)
        if engine.sends_slot_rows_apart(rooms.slot_for(need, guard.slot_size)):
            rooms.learn(need, world)  # the next such call rides
        return None
    me, dtype = engine.rank, chunks[0].dtype
    return [p[table_bytes : table_bytes + t[me] * item].view(dtype) for p, t in zip(parts, tables)]
