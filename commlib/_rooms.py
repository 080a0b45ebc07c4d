"""How large the first round's slot is, learnt alike on every rank of a group.

The argument check (:mod:`commlib._guard`) and ``all_gather`` (:mod:`commlib._ragged`)
both start with one slot per rank, the same number of bytes on every rank, so
that no engine ever sees ranks disagree on a size. Data that fits the slot
travels in it, and the collective completes in that one round; larger data
takes a second round.

The slot grows to what the last calls needed: after each round every rank
knows every rank's byte count, the same on every rank, so every rank sizes
the next slot alike (:class:`Rooms`, one per process group, shared by both
protocols so their first rounds stay the same size). A loop of steady sizes
then completes each call in one round from its second call on.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from commlib._engine import Engine

#: the largest header of a protocol that uses the slot (``all_gather``'s shapes)
HEADER = 288

#: what a slot may learn, over all ranks (bytes): larger needs take two rounds
#: rather than pad every rank's slot
LEARN_TOTAL = 2 << 20

#: what a slot learns from a collective where only some ranks need the data (a
#: broadcast, a reduce, a gather): a larger slot would pad every rank's part of
#: the first round by more than the second round costs. Measured on gloo,
#: 127.0.0.1: 128 KiB slots cost 55 us more a round than 4 KiB ones at 2 ranks
#: (230 us at 4), less than the round they save (160-430 us). Through shared
#: memory a slot pads nothing: there every call learns up to the segment's room
#: (:mod:`commlib._check_round`).
PAD_UP_TO = 128 << 10

#: calls in a row needing less than half the room before it shrinks
SHRINK_AFTER = 8


def need_of(largest: int, everyone_needs_all: bool) -> int:
    """What a call whose largest data was ``largest`` bytes teaches the slot.

    Examples:
        >>> need_of(300_000, everyone_needs_all=True), need_of(300_000, everyone_needs_all=False)
        (300000, 0)
    """
    return largest if everyone_needs_all or largest <= PAD_UP_TO else 0


def learn_cap(world: int) -> int:
    """The most data a slot learns to carry per rank in a group of ``world`` ranks.

    Examples:
        >>> learn_cap(2), learn_cap(4)
        (1048576, 524288)
    """
    return LEARN_TOTAL // max(world, 1)


def shared_cap(engine: Engine) -> int | None:
    """The most a call's data teaches the slot where ``engine``'s group shares its rounds.

    Through shared memory (:mod:`commlib._shared_rows`) a round copies only the
    bytes written, so a large slot pads nothing: a call's data rides up to the
    segment's room. ``None``: the engine's rule (:func:`learn_cap`, :func:`need_of`).

    Examples:
        >>> shared_cap(engine) is None or shared_cap(engine) > learn_cap(engine.world_size)
        True
    """
    shared = engine.kept.get("shared")
    return None if shared is None or not engine.on_cpu else shared.area - HEADER - 16


def teaches(engine: Engine, nbytes: int, everyone_needs_all: bool) -> tuple[int, int]:
    """What a call with ``nbytes`` of data teaches the slot, and the most it learns.

    Through shared memory a call's data up to :func:`shared_cap` (a large
    slot pads nothing there); otherwise :func:`need_of` up to :func:`learn_cap`.

    Examples:
        >>> need, cap = teaches(engine, 300_000, everyone_needs_all=True)
        >>> need
        300000
    """
    cap = shared_cap(engine)
    if cap is not None and nbytes <= cap:
        return nbytes, cap
    return need_of(nbytes, everyone_needs_all), learns_up_to(engine)


def learns_up_to(engine: Engine) -> int:
    """The most ``engine``'s slot learns to carry per rank: :func:`shared_cap`, else
    :func:`learn_cap`.

    Examples:
        >>> learns_up_to(engine) >= learn_cap(engine.world_size)
        True
    """
    cap = shared_cap(engine)
    return learn_cap(engine.world_size) if cap is None else cap


class Rooms:
    """The room for data the next slot has, learnt from the last calls.

    Grows at once to a need up to :func:`learn_cap`; shrinks only after
    :data:`SHRINK_AFTER` calls in a row needed less than half of it (so a
    loop alternating a large and a small call keeps the large room). A need
    above the cap counts as none: such calls take two rounds whatever the
    slot, and a large slot only pads their first round (a loop of 4 MiB
    all_reduces after one 1 MiB call sent 1 MiB slots on every call).

    Examples:
        >>> rooms = Rooms()
        >>> rooms.slot_bytes(4096)              # nothing learnt: the communicator's slot
        4096
        >>> rooms.learn(65536, world=2); rooms.slot_bytes(4096)
        65824
        >>> rooms.learn(16, world=2); rooms.slot_bytes(4096)    # one small call: kept
        65824
        >>> for _ in range(SHRINK_AFTER): rooms.learn(16, world=2)
        >>> rooms.slot_bytes(4096)
        4096
        >>> rooms.learn(65536, world=2)
        >>> for _ in range(SHRINK_AFTER): rooms.learn(8 << 20, world=2)  # past the cap
        >>> rooms.slot_bytes(4096)
        4096
    """

    __slots__ = ("learnt", "recent", "smaller")

    def __init__(self) -> None:
        self.learnt = 0
        self.smaller = 0
        self.recent = 0

    def slot_bytes(self, floor: int) -> int:
        """Bytes of the next slot: at least ``floor``, and a header plus the learnt room."""
        return max(floor, HEADER + self.learnt) if self.learnt else floor

    def slot_for(self, need: int, floor: int) -> int:
        """Bytes of a slot with room for ``need`` (at least ``floor``), learnt from nothing else.

        Examples:
            >>> Rooms().slot_for(65536, 4096)
            65824
        """
        return max(floor, HEADER + (need + 15) // 16 * 16)

    def learn(self, largest: int, world: int, cap: int | None = None) -> None:
        """The largest byte count of the round just gathered (known alike on every rank).

        ``cap``: the most it learns, where not :func:`learn_cap` (a group whose
        rounds go through shared memory, :mod:`commlib._check_round`).
        """
        if largest > (learn_cap(world) if cap is None else cap):
            largest = 0
        if largest > self.learnt:
            self.learnt = (largest + 15) // 16 * 16
        elif 2 * largest < self.learnt:
            self.smaller += 1
            self.recent = max(self.recent, largest)
            if self.smaller < SHRINK_AFTER:
                return
            self.learnt = (self.recent + 15) // 16 * 16
        self.smaller = self.recent = 0


_rooms: weakref.WeakKeyDictionary[Any, Rooms] = weakref.WeakKeyDictionary()


def rooms_of(engine: Engine) -> Rooms:
    """The learnt rooms of ``engine``'s process group (its own for a group of ``None``).

    Examples:
        >>> rooms_of(engine).slot_bytes(4096)
        4096
    """
    found: Rooms | None = engine.kept.get("rooms")
    if found is None:
        key = engine.group if engine.group is not None else engine
        found = _rooms.get(key)
        if found is None:
            found = _rooms[key] = Rooms()
        engine.kept["rooms"] = found
    return found
