"""What each collective is: one row per public collective, every fact the other rooms read.

A room that must know something about a collective (whether its first round
can carry a refusal, whether its engine calls are numbered apart, how its bus
bandwidth is counted, which argument observers describe) reads it here, from
the collective's row, or from a set this module derives from the rows. Adding a
collective starts with its row (docs/architecture.md, "Adding a collective").

Examples:
    >>> ROWS["all_reduce"].payload, ROWS["all_reduce"].op
    ('tensor', 'op')
    >>> "send" in POINT_TO_POINT, "all_reduce" in CHECKED_ROUNDS
    (True, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

#: how a collective's payload is counted in bus bandwidth (nccl-tests' factors)
Busbw = Literal["2(n-1)/n", "(n-1)/n", "1"]

#: what a collective's first round is, where every rank of the group joins one:
#: ``"checked"``, the argument check's slots (tensor collectives, where checked);
#: ``"objects"``, the object collectives' slots (always); ``None``: no such round
FirstRound = Literal["checked", "objects"]


@dataclass(frozen=True)
class Collective:
    """One collective's facts.

    Attributes:
        name: the method's name (and the name in events, errors and traces).
        first_round: the round every rank joins first, which a rank's argument
            error can join so that every rank raises (:meth:`commlib._guard.Guard.refuse`).
        sized: a checked round whose slot carries the data's size, so a
            mismatch would end the engine: checked in the guard mode too, not
            only in strict mode.
        ragged: its first round exchanges every rank's shape (:mod:`commlib._ragged`).
        needs_all: checked, every rank needs every rank's data: the slot learns
            its sizes up to its cap (others only up to ``_rooms.PAD_UP_TO``).
        point_to_point: only the ranks involved make its engine calls, which are
            numbered apart (:attr:`commlib._engine.Engine.p2p_seq`).
        busbw: its bus-bandwidth factor, or ``None`` where commlib bench has none.
        times_world: its payload is one rank's part of what it moves (the
            statistics count the whole, as commlib bench does).
        slot_code: its op code in an object round's slot (``commlib._slots``).
        payload: the argument observers describe (tensors or object).
        peer: the argument naming its root or peer (``"src"``, ``"dst"``).
        op: the argument naming its reduce op.
        uniform: every rank passes the same shapes and dtypes.
    """

    name: str
    first_round: FirstRound | None = None
    sized: bool = True
    ragged: bool = False
    needs_all: bool = False
    point_to_point: bool = False
    busbw: Busbw | None = None
    times_world: bool = False
    slot_code: int = 0
    payload: str | None = None
    peer: str | None = None
    op: str | None = None
    uniform: bool = False


_C: Final = "checked"
_O: Final = "objects"
_REDUCE: Final = "2(n-1)/n"
_GATHER: Final = "(n-1)/n"
_ONE: Final = "1"

#: every public collective of a communicator, in the order the docs list them
_ROWS = (
    # group changes and agreement
    Collective("split"),
    Collective("shrink"),
    Collective("grow"),
    Collective("ensure_same"),
    # tensor collectives
    Collective("all_gather_shapes", _C, sized=False, ragged=True, payload="tensor"),
    Collective("all_gather_cat", payload="data"),
    Collective(
        "all_reduce", _C, needs_all=True, busbw=_REDUCE, payload="tensor", op="op", uniform=True
    ),
    Collective(
        "all_gather",
        _C,
        sized=False,
        ragged=True,
        busbw=_GATHER,
        times_world=True,
        payload="tensor",
    ),
    Collective(
        "all_gather_into_tensor",
        _C,
        needs_all=True,
        busbw=_GATHER,
        times_world=True,
        payload="tensor",
        uniform=True,
    ),
    Collective(
        "gather",
        _C,
        sized=False,
        ragged=True,
        busbw=_GATHER,
        times_world=True,
        payload="tensor",
        peer="dst",
        uniform=True,
    ),
    Collective("gather_into_tensor", _C, payload="tensor", peer="dst", uniform=True),
    Collective("broadcast", _C, busbw=_ONE, payload="tensor", peer="src", uniform=True),
    Collective(
        "reduce_scatter",
        _C,
        busbw=_GATHER,
        times_world=True,
        payload="output",
        op="op",
        uniform=True,
    ),
    Collective("barrier", _C, sized=False),
    Collective(
        "reduce",
        _C,
        busbw=_ONE,
        payload="tensor",
        peer="dst",
        op="op",
        uniform=True,
    ),
    Collective(
        "scatter",
        _C,
        busbw=_GATHER,
        times_world=True,
        payload="tensor",
        peer="src",
        uniform=True,
    ),
    Collective("all_to_all", _C, needs_all=True, busbw=_GATHER, payload="input_tensor_list"),
    Collective("all_to_all_single", _C, needs_all=True, busbw=_GATHER, payload="input"),
    # point to point
    Collective("send", point_to_point=True, payload="tensor", peer="dst"),
    Collective("recv", point_to_point=True, payload="tensor", peer="src"),
    Collective("isend", point_to_point=True, payload="tensor", peer="dst"),
    Collective("irecv", point_to_point=True, payload="tensor", peer="src"),
    Collective("batch_isend_irecv", point_to_point=True),
    # object collectives
    Collective("all_gather_object", _O, busbw=_GATHER, slot_code=1, payload="obj"),
    Collective("gather_object", _O, busbw=_GATHER, slot_code=2, payload="obj", peer="dst"),
    Collective(
        "broadcast_object_list", _O, busbw=_ONE, slot_code=3, payload="object_list", peer="src"
    ),
    Collective("broadcast_object", _O, slot_code=3, payload="obj", peer="src"),
    Collective("scatter_object_list", _O, slot_code=4, payload="input_list", peer="src"),
    Collective(
        "send_object_list", point_to_point=True, slot_code=5, payload="object_list", peer="dst"
    ),
    Collective("recv_object_list", point_to_point=True, payload="object_list", peer="src"),
)

#: name -> row
ROWS: dict[str, Collective] = {row.name: row for row in _ROWS}


def _names(fact: str, value: object = True) -> frozenset[str]:
    return frozenset(row.name for row in _ROWS if getattr(row, fact) == value)


#: collectives whose first round is the argument check's (the tensor ones, where checked)
CHECKED_ROUNDS = _names("first_round", "checked")
#: ... and those whose first round is the object slots' exchange (always)
OBJECT_ROUNDS = _names("first_round", "objects")
#: checked rounds that carry no size: checked only in strict mode
UNSIZED = CHECKED_ROUNDS - _names("sized")
#: first rounds of every rank's shape (commlib._ragged)
RAGGED = _names("ragged")
#: checked collectives where every rank needs every rank's data
EVERYONE_NEEDS_ALL = _names("needs_all")
#: what point-to-point calls name their engine calls (numbered apart)
POINT_TO_POINT = _names("point_to_point")
#: collectives whose payload is one rank's part of what the operation moves
TIMES_WORLD = _names("times_world")
#: collective name -> its bus-bandwidth factor, where it has one
BUSBW: dict[str, Busbw] = {row.name: row.busbw for row in _ROWS if row.busbw is not None}
#: an object round's op code -> the collective it names (the first row with the code)
SLOT_NAMES: dict[int, str] = {}
for _row in reversed(_ROWS):
    if _row.slot_code:
        SLOT_NAMES[_row.slot_code] = _row.name
#: collective name -> its object round's op code
SLOT_CODES: dict[str, int] = {row.name: row.slot_code for row in _ROWS if row.slot_code}
