"""``CollectiveEvent``: what an observer is told about one collective."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from commlib.observe.call_site import CallSite

#: The states of a collective: started, then one of the other three.
STATES = ("started", "completed", "failed", "timed out")


@dataclass(eq=False, slots=True)
class CollectiveEvent:
    """One user-level collective, as observers see it.

    The same object is passed to ``commlib_collective_start`` and, with the
    fields below ``start`` filled in, to ``commlib_collective_end``. Its
    fields are slots (no ``__dict__``): the dispatcher fills them in one by
    one, on every observed call, for less than a dictionary costs.

    Attributes:
        communicator: the :class:`~commlib.Communicator` it ran on.
        name: the collective (``"all_reduce"``, ``"broadcast_object_list"``).
        seq: its sequence number on this communicator, the same on every rank:
            the engine's number of its first backend call, so a collective that
            takes several calls leaves gaps (and error messages such as "failed
            in broadcast #12" use the same numbers). Point-to-point calls are
            numbered apart, per rank (``send #3``: this rank's third).
        group: the communicator's name, the same on every rank: ``"world"``, or
            the process group's name; a second communicator over the same
            group gets ``#2`` appended (in the order each rank first used it).
        group_ranks: the group's members as world ranks, in group order.
        rank: this process's rank in the group.
        shapes: the shape of each tensor passed (empty for objects).
        dtypes: their dtypes (``"float32"``), or the object's type name.
        nbytes: bytes of the tensors passed (0 for objects).
        peers: the root or peer as a group rank (``{"src": 0}``), if any.
        op: the reduce op, if any.
        uniform: whether every rank must pass the same shapes and dtypes.
        async_op: whether the call returned a handle.
        start: wall-clock time (``time.time()``) the call was made.
        duration: seconds from the call to its end (``None`` until it ended).
        error: the exception it ended with, if any.
        state: one of ``"started"``, ``"completed"``, ``"failed"``, ``"timed out"``.
        point_to_point: whether it is a point-to-point call (``send``,
            ``recv_object_list``, ...), which only the ranks involved make.
        call_site: the caller's line (file, line, function: the first frame
            outside commlib), filled in when an observer asks for it (an
            observer with ``commlib_call_sites = True``; the flight recorder
            has), ``None`` otherwise.

    Examples:
        >>> from commlib.observe import CollectiveEvent
        >>> e = CollectiveEvent(None, "all_reduce", 3, "world", (0,), 0, ((4,),), ("float32",), 16)
        >>> e.describe()
        'float32 (4,)'
    """

    communicator: Any
    name: str
    seq: int
    group: str
    group_ranks: tuple[int, ...]
    rank: int
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    nbytes: int = 0
    peers: Mapping[str, int] = field(default_factory=dict)
    op: str | None = None
    uniform: bool = False
    async_op: bool = False
    start: float = 0.0
    duration: float | None = None
    error: BaseException | None = None
    state: str = "started"
    point_to_point: bool = False
    call_site: CallSite | None = None

    def describe(self) -> str:
        """Peers, op, dtypes and shapes in a few words (``"src 0, float32 (4,)"``).

        Examples:
            >>> CollectiveEvent(None, "broadcast", 1, "world", (0, 1), 0, ((4,),),
            ...                 ("float32",), 16, {"src": 0}).describe()
            'src 0, float32 (4,)'
        """
        return describe(self.peers, self.op, self.dtypes, self.shapes)


def describe(
    peers: Mapping[str, int],
    op: str | None,
    dtypes: tuple[str, ...] | list[str],
    shapes: tuple[tuple[int, ...], ...] | list[list[int]],
) -> str:
    """The words :meth:`CollectiveEvent.describe` and ``commlib trace`` use.

    Examples:
        >>> describe({"dst": 1}, None, ["int64"], [[2, 3]])
        'dst 1, int64 (2, 3)'
        >>> describe({}, "sum", ["float32", "float32"], [[2], [3]])
        'sum, float32 (2,), float32 (3,)'
    """
    words = [f"{role} {rank}" for role, rank in peers.items()]
    if op:
        words.append(op)
    for i, dtype in enumerate(dtypes):
        shape = tuple(shapes[i]) if i < len(shapes) else None
        words.append(dtype if shape is None else f"{dtype} {shape}")
    return ", ".join(words)


def _nbytes(tensor: torch.Tensor) -> int:
    """``tensor.nbytes``; a sparse tensor has none: its dense size (the collective refuses it)."""
    try:
        return tensor.nbytes
    except RuntimeError:
        return tensor.numel() * tensor.element_size()


def payload_facts(value: Any) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...], int]:
    """Shapes, dtypes and bytes of what a caller passed: a tensor, a list of them, an object.

    Examples:
        >>> payload_facts(torch.zeros(2, 3))
        (((2, 3),), ('float32',), 24)
        >>> payload_facts({"a": 1})
        ((), ('dict',), 0)
    """
    if isinstance(value, torch.Tensor):
        return ((tuple(value.shape),), (_dtype_name(value.dtype),), _nbytes(value))
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        # the same shapes and dtypes call after call: their facts are made once. Each
        # tensor's pair read by a C getter (no Python step a tensor), a list of
        # tensors alone; one with other things in it filtered first
        try:
            key = tuple(map(_SHAPE_AND_DTYPE, value))
        except AttributeError:
            key = tuple([(t.shape, t.dtype) for t in value if isinstance(t, torch.Tensor)])
        found = _LIST_FACTS.get(key)
        if found is None:
            if len(_LIST_FACTS) >= _LIST_FACTS_KEPT:
                _LIST_FACTS.clear()
            tensors = [t for t in value if isinstance(t, torch.Tensor)]
            found = _LIST_FACTS[key] = (
                tuple(tuple(t.shape) for t in tensors),
                tuple(_dtype_name(t.dtype) for t in tensors),
                sum(_nbytes(t) for t in tensors),
            )
        return found
    if value is None:
        return (), (), 0
    return (), (type(value).__name__,), 0


_DTYPE_NAMES: dict[torch.dtype, str] = {}
_SHAPE_AND_DTYPE = operator.attrgetter("shape", "dtype")
# a list's facts by its tensors' (shape, dtype): bytes are elements times element size
# whatever the strides, so the two say it all; bounded, for shapes that keep changing
_LIST_FACTS: dict[tuple[tuple[torch.Size, torch.dtype], ...], tuple[Any, ...]] = {}
_LIST_FACTS_KEPT = 1024


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name
