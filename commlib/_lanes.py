"""The direct path: the lane table and each collective's fast entry.

A plugin may name, per collective and key (op, dtype, root), the one engine
call its method would make (:meth:`commlib.Backend.direct_call`). The
communicator learns it once, after the first call with that key passed
validation (:func:`learn`); later blocking calls with the communicator's own
timeout, unchecked, on contiguous tensors on the device, take it: the
collective's fast entry here (:class:`Lanes`) hands it to the engine in one
step (:meth:`commlib._engine.Engine.direct`). A miss returns ``False`` and the
method goes the whole way (validation, the check, the plugin's method).

The table is the engine's (``engine.lanes``: ``(collective, *key) -> call or
None``); the protocols' first rounds take it too (:func:`round_lane`).

Examples:
    >>> comm = commlib.Communicator()          # single: no lanes
    >>> comm._lanes.all_reduce(torch.ones(2), "sum", False, None)
    False
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

import torch

from commlib import _steps
from commlib._host_copy import host_clone
from commlib.reductions import copy_back

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from commlib._engine import Engine
    from commlib.backend import Backend, DirectCall
    from commlib.types import EngineOp

# tensors whose collectives torch sends as they are (another subclass may route
# them through __torch_function__): what the engine's direct calls take
PLAIN = (torch.Tensor, torch.nn.Parameter)
_STRIDED = torch.strided
# the stride of a 1-dim contiguous tensor
_FLAT = (1,)


# -- the lane table -----------------------------------------------------------------------
def _owner(cls: type, name: str) -> type:
    return next(k for k in cls.__mro__ if name in k.__dict__)


def vouched_for(cls: type[Backend], collective: str) -> bool:
    """Whether ``cls``'s ``direct_call`` knows its method for ``collective``.

    Only if the class that wrote ``direct_call`` derives from the one that
    wrote the method: a subclass that overrides a collective (logging, timing
    it) has it called, unless it writes its own ``direct_call`` too.

    Examples:
        >>> gloo = type(commlib.plugins.resolve_backend("gloo"))
        >>> vouched_for(gloo, "all_reduce")
        True
        >>> class Logged(gloo):
        ...     def all_reduce(self, tensor, op, group, async_op=False):
        ...         return super().all_reduce(tensor, op, group, async_op)
        >>> vouched_for(Logged, "all_reduce"), vouched_for(Logged, "broadcast")
        (False, True)
    """
    return issubclass(_owner(cls, "direct_call"), _owner(cls, collective))


def learn(
    engine: Engine, collective: str, *, as_key: tuple[Any, ...] | None = None, **key: Any
) -> DirectCall | None:
    """The plugin's direct call for ``collective`` and ``key``, asked once and kept.

    Kept in ``engine.lanes`` under ``(collective, *key.values())``, or under
    ``as_key`` (a ``mean`` the caller finishes from the engine's ``sum``).
    The communicator asks after it validated a call's arguments, so a key in
    the table stands for arguments known to be valid; its next calls with that
    key look there first.

    Examples:
        >>> engine = commlib.Communicator()._engine
        >>> learn(engine, "all_reduce", op="sum", dtype=torch.float32)  # single: none
    """
    lane = None
    if vouched_for(type(engine.plugin), collective):
        lane = engine.direct_call(collective, **key)
    engine.lanes[(collective, *key.values()) if as_key is None else as_key] = lane
    return lane


def learn_once(engine: Engine, collective: str, **key: Any) -> None:
    """:func:`learn`, unless the table holds ``(collective, *key.values())`` already."""
    if (collective, *key.values()) not in engine.lanes:
        learn(engine, collective, **key)


def round_lane(
    engine: Engine, slot_bytes: int, apart: bool = False, timeout: Any = None
) -> DirectCall | None:
    """The direct call for a protocol's first round of ``slot_bytes`` rows, if any.

    Where the group's ranks share this machine's memory, the round through
    it (:mod:`commlib._shared_rows`, set up by the protocol's first round),
    with any ``timeout``. Otherwise the plugin's ``all_gather_slots`` as
    the one engine call it makes: an all_to_all_single of the rows
    (``apart``: row ``j`` goes to rank ``j``,
    :meth:`~commlib.Backend.sends_slot_rows_apart`) or an all_gather of the
    first; for the communicator's timeout only (``timeout`` ``None``).
    Asked once per slot size (:func:`learn`); none where the plugin gathers
    bytes its own way, for a slot outside the call's byte range, or while
    the group is in an open coalescing manager.

    Examples:
        >>> round_lane(commlib.Communicator()._engine, 4096) is None   # single: none
        True
    """
    key = ("all_gather_slots", slot_bytes, apart)
    lanes = engine.lanes
    if key in lanes:
        lane = lanes[key]
    else:
        shared = engine.kept.get("shared")
        lane = None if shared is None else shared.lane(slot_bytes, apart)
        if lane is None:
            lane = learn(engine, "all_gather_slots", slot_bytes=slot_bytes, apart=apart)
        else:
            lanes[key] = lane
    if (
        lane is None
        or lane.call is None
        or (timeout is not None and lane.via != "shared")
        or not lane.min_bytes <= slot_bytes <= lane.max_bytes
        or (lane.unless_in and engine.group in lane.unless_in)
    ):
        return None
    return lane


def serves(
    engine: Engine, lane: DirectCall, tensor: torch.Tensor, other: torch.Tensor | None = None
) -> bool:
    """Whether ``lane`` takes ``tensor`` (and ``other``) as they are.

    Both on the device, dense and contiguous; ``tensor``'s bytes in the lane's
    range; the group in no open coalescing manager.

    Examples:
        >>> from commlib.backend import DirectCall
        >>> serves(commlib.Communicator()._engine, DirectCall(None, None), torch.ones(2))
        True
    """
    pending = lane.unless_in
    if (
        not (tensor.is_cpu if engine.on_cpu else tensor.device == engine.device_obj)
        or tensor.layout is not _STRIDED
        or not tensor.is_contiguous()
        or not lane.min_bytes <= tensor.nbytes <= lane.max_bytes
        or (pending and engine.group in pending)
    ):
        return False
    return other is None or takes(engine, other)


def takes(engine: Engine, tensor: torch.Tensor) -> bool:
    """Whether a direct call takes ``tensor`` as it is: on the device, dense, contiguous.

    Examples:
        >>> engine = commlib.Communicator()._engine
        >>> takes(engine, torch.ones(2)), takes(engine, torch.ones(2, 2).t())
        (True, False)
    """
    return (
        (tensor.is_cpu if engine.on_cpu else tensor.device == engine.device_obj)
        and tensor.layout is _STRIDED
        and tensor.is_contiguous()
    )


def _divides_in_place(tensor: torch.Tensor) -> bool:
    # what divide_back divides in place: floating point, wider than a byte
    return tensor.is_floating_point() and tensor.element_size() > 1


def _plain_like(tensors: Any, length: int, like: torch.Tensor) -> TypeGuard[list[torch.Tensor]]:
    """Whether ``tensors`` is a list of ``length`` plain tensors shaped and typed ``like``."""
    if type(tensors) is not list or len(tensors) != length:
        return False
    shape, dtype = like.shape, like.dtype
    for t in tensors:
        if type(t) not in PLAIN or t.dtype is not dtype or t.shape != shape:
            return False
    return True


def plain_list(engine: Engine, tensors: Any, like: torch.Tensor) -> TypeGuard[list[torch.Tensor]]:
    """Whether a direct call takes ``tensors``: a list of the group's size, each like ``like``.

    Examples:
        >>> engine, one = commlib.Communicator()._engine, torch.ones(2)
        >>> plain_list(engine, [torch.ones(2)], one), plain_list(engine, None, one)
        (True, False)
    """
    return _plain_like(tensors, engine.world_size, like) and all(takes(engine, t) for t in tensors)


def scatter_by(
    engine: Engine, lane: DirectCall, tensor: torch.Tensor, scatter_list: Any, src: int
) -> None:
    """``scatter`` through ``lane``; on ``src``, ``scatter_list`` passed :func:`plain_list`.

    Examples:
        >>> scatter_by(engine, lane, out, parts, 0)  # doctest: +SKIP
    """
    me = engine.rank
    if me != src:
        if lane.via is None:
            engine.direct("scatter", lane, [tensor], [])
        else:  # the root's list broadcast whole: this rank keeps its part
            whole = tensor.new_empty((engine.world_size, *tensor.shape))
            engine.direct("scatter", lane, [whole])
            tensor.copy_(whole[me])
    elif lane.via is None:
        engine.direct("scatter", lane, [tensor], [list(scatter_list)])
    else:
        engine.direct("scatter", lane, [torch.stack(scatter_list)])
        tensor.copy_(scatter_list[me])


# -- each collective's fast entry -----------------------------------------------------------
class Riding(Protocol):
    """The checked calls' fast entries (:class:`commlib._checked_lanes.CheckedLanes`)."""

    def all_reduce(self, tensor: torch.Tensor, op: str) -> bool: ...
    def broadcast(self, tensor: torch.Tensor, src: int) -> bool: ...
    def reduce(self, tensor: torch.Tensor, dst: int, op: str) -> bool: ...
    def all_gather_into_tensor(self, output: torch.Tensor, tensor: torch.Tensor) -> bool: ...
    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str) -> bool: ...
    def scatter(self, tensor: torch.Tensor, scatter_list: Any, src: int) -> bool: ...
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor) -> bool: ...
    def all_to_all(self, outputs: Any, inputs: Any) -> bool: ...


class Lanes:
    """One communicator's fast entries: each takes the call's arguments, says whether it ran.

    ``True``: the lane ran the call (a blocking, unchecked call whose key an
    earlier validated call learnt). ``False``: the communicator's method goes
    the whole way, and learns the lane after validating (``learn_*``).

    Args:
        engine: the communicator's engine (``None`` for a non-member: no lanes).
        checked: the collectives the communicator's argument check runs for
            (they never take a lane).
        check_finite: the communicator's ``check_finite`` (reductions that
            check for NaN take no lane), kept here by its setter: a value, not
            the communicator (which holds this object: no reference cycle).
        riding: the checked calls' entries, where the plugin sets
            ``checked_lanes`` (:mod:`commlib._checked_lanes`): a steady checked
            call takes its prepared round from there.
    """

    __slots__ = ("check_finite", "checked", "engine", "gathers_checked", "native_avg", "riding")

    def __init__(
        self,
        engine: Engine | None,
        checked: frozenset[str],
        check_finite: bool,
        riding: Riding | None = None,
    ):
        self.engine = engine
        self.checked = checked
        self.check_finite = check_finite
        self.native_avg = engine is not None and engine.native_avg
        self.gathers_checked = "all_gather_into_tensor" in checked
        self.riding = riding

    def _lane(self, engine: Engine, key: tuple[Any, ...]) -> DirectCall | None:
        lane = engine.lanes.get(key)
        # (a communicator outside torch.distributed runs the single backend: no lanes)
        if lane is None or _steps.unfinished or key[0] in self.checked:
            return None
        return lane

    def barrier(self, async_op: bool, timeout: Any) -> bool:
        engine = self.engine
        if engine is None or async_op or timeout is not None:
            return False
        lane = self._lane(engine, ("barrier",))
        if lane is None:
            return False
        engine.direct("barrier", lane)
        return True

    def all_reduce(self, tensor: Any, op: Any, async_op: bool, timeout: Any) -> bool:
        engine = self.engine
        if (
            engine is None
            or type(tensor) not in PLAIN
            or type(op) is not str  # a key of the lanes (a user's list must not reach a dict)
            or async_op
            or timeout is not None
        ):
            return False
        if self.riding is not None and "all_reduce" in self.checked:
            return not self.check_finite and self.riding.all_reduce(tensor, op)
        lane = self._lane(engine, ("all_reduce", op, tensor.dtype))
        if lane is None or self.check_finite or not serves(engine, lane, tensor):
            return False
        if op != "mean":
            engine.direct("all_reduce", lane, [tensor])
            return True
        if tensor.requires_grad:  # (autograd refuses the division in place)
            return False
        engine.direct("all_reduce", lane, [tensor])
        if not self.native_avg:
            tensor.div_(engine.world_size)  # a floating dtype: see learn_all_reduce
        return True

    @staticmethod
    def learn_all_reduce(
        engine: Engine,
        op: Any,
        name: str,
        engine_op: EngineOp,
        back: Callable[..., Any],
        tensor: torch.Tensor,
    ) -> None:
        """Learn ``all_reduce``'s lane for ``op`` (validated as ``name``), where one serves it."""
        key = ("all_reduce", op, tensor.dtype)
        if key in engine.lanes:
            return
        if engine_op == op:
            learn(engine, "all_reduce", op=engine_op, dtype=tensor.dtype)
        elif name == op == "mean" and (back is copy_back or _divides_in_place(tensor)):
            # the engine's avg, or its sum divided in place
            learn(engine, "all_reduce", as_key=key, op=engine_op, dtype=tensor.dtype)

    def all_gather_into_tensor(
        self, output: Any, tensor: Any, async_op: bool, timeout: Any
    ) -> bool:
        engine = self.engine
        if (
            engine is None
            or async_op
            or timeout is not None
            or type(tensor) not in PLAIN
            or type(output) not in PLAIN
        ):
            return False
        if self.riding is not None and self.gathers_checked:
            return self.riding.all_gather_into_tensor(output, tensor)
        dtype = tensor.dtype
        lane = engine.lanes.get(("all_gather_into_tensor", dtype))
        if lane is None or _steps.unfinished or self.gathers_checked:
            return False
        # the fewest tensor attributes that say it all (each costs a torch getter): a
        # stride of (1,) is one dimension, dense and contiguous; equal dtypes make the
        # byte counts the element counts the communicator's check compares
        try:
            flat = tensor.stride() == _FLAT and output.stride() == _FLAT
        except RuntimeError:  # a layout without strides (sparse, mkldnn): the whole way
            return False
        nbytes = tensor.nbytes
        pending = lane.unless_in
        if (
            not flat
            or output.dtype is not dtype
            or output.nbytes != nbytes * engine.world_size
            or not lane.min_bytes <= nbytes <= lane.max_bytes
            or not (
                (tensor.is_cpu and output.is_cpu)
                if engine.on_cpu
                else (tensor.device == engine.device_obj and output.device == engine.device_obj)
            )
            or (pending and engine.group in pending)
        ):
            return False  # (a wrong output size: the method's ValueError, before anything is sent)
        engine.direct("all_gather_into_tensor", lane, output, tensor)
        return True

    def broadcast(self, tensor: Any, src: Any, async_op: bool, timeout: Any) -> bool:
        engine = self.engine
        if (
            engine is None
            or type(tensor) not in PLAIN
            or type(src) is not int
            or async_op
            or timeout is not None
        ):
            return False
        if self.riding is not None and "broadcast" in self.checked:
            return self.riding.broadcast(tensor, src)
        lane = self._lane(engine, ("broadcast", src, tensor.dtype))
        if lane is None or not serves(engine, lane, tensor):
            return False
        engine.direct("broadcast", lane, [tensor])
        return True

    def reduce_scatter(
        self, output: Any, input: Any, op: Any, async_op: bool, timeout: Any
    ) -> bool:
        engine = self.engine
        if (
            engine is None
            or async_op
            or timeout is not None
            or type(input) not in PLAIN
            or type(output) not in PLAIN
            or type(op) is not str
        ):
            return False
        if self.riding is not None and "reduce_scatter" in self.checked:
            return not self.check_finite and self.riding.reduce_scatter(output, input, op)
        dtype = output.dtype
        lane = self._lane(engine, ("reduce_scatter", op, dtype))
        if lane is None:
            return False
        # as all_gather_into_tensor's entry: strides, byte counts, devices
        try:
            flat = output.stride() == _FLAT and input.stride() == _FLAT
        except RuntimeError:  # a layout without strides: the whole way
            return False
        nbytes = output.nbytes
        pending = lane.unless_in
        if (
            not flat
            or input.dtype is not dtype
            or input.nbytes != nbytes * engine.world_size
            or not lane.min_bytes <= nbytes <= lane.max_bytes
            or not (
                (output.is_cpu and input.is_cpu)
                if engine.on_cpu
                else (output.device == engine.device_obj and input.device == engine.device_obj)
            )
            or (pending and engine.group in pending)
        ):
            return False
        engine.direct("reduce_scatter", lane, output, input)
        return True

    def reduce(self, tensor: Any, dst: Any, op: Any, async_op: bool, timeout: Any) -> bool:
        engine = self.engine
        if (
            engine is None
            or async_op
            or timeout is not None
            or type(tensor) not in PLAIN
            or type(op) is not str
            or type(dst) is not int
        ):
            return False
        if self.riding is not None and "reduce" in self.checked:
            return not self.check_finite and self.riding.reduce(tensor, dst, op)
        lane = self._lane(engine, ("reduce", op, dst, tensor.dtype))
        if lane is None or self.check_finite or not serves(engine, lane, tensor):
            return False
        # the engine may use the buffer of a rank other than dst as scratch space
        engine.direct("reduce", lane, [tensor if engine.rank == dst else host_clone(tensor)])
        return True

    def scatter(
        self, tensor: Any, scatter_list: Any, src: Any, async_op: bool, timeout: Any
    ) -> bool:
        engine = self.engine
        if (
            engine is None
            or async_op
            or timeout is not None
            or type(tensor) not in PLAIN
            or type(src) is not int
        ):
            return False
        if self.riding is not None and "scatter" in self.checked:
            return self.riding.scatter(tensor, scatter_list, src)
        lane = self._lane(engine, ("scatter", src, tensor.dtype))
        if lane is None or not serves(engine, lane, tensor):
            return False
        if engine.rank == src and not plain_list(engine, scatter_list, tensor):
            return False
        scatter_by(engine, lane, tensor, scatter_list, src)
        return True

    def all_to_all_checked(self, outputs: Any, inputs: Any, async_op: bool, timeout: Any) -> bool:
        """A steady checked ``all_to_all`` (lists of one shape) from its prepared round."""
        riding = self.riding
        if riding is None or async_op or timeout is not None or "all_to_all" not in self.checked:
            return False
        return riding.all_to_all(outputs, inputs)

    @staticmethod
    def all_to_all(
        engine: Engine, outs: list[torch.Tensor], ins: list[torch.Tensor], dtype: torch.dtype
    ) -> bool:
        """``all_to_all`` of validated plain tensors of one shape, where the plugin has it."""
        key = ("all_to_all", dtype)
        lanes = engine.lanes
        lane = lanes[key] if key in lanes else learn(engine, "all_to_all", dtype=dtype)
        if (
            lane is None
            or lane.call is None
            or (lane.unless_in and engine.group in lane.unless_in)
        ):
            return False
        engine.direct("all_to_all", lane, outs, ins)
        return True

    def all_to_all_single(
        self,
        output: Any,
        input: Any,
        output_split_sizes: Sequence[int] | None,
        input_split_sizes: Sequence[int] | None,
        async_op: bool,
        timeout: Any,
    ) -> bool:
        engine = self.engine
        if (
            engine is None
            or output_split_sizes is not None
            or input_split_sizes is not None
            or async_op
            or timeout is not None
            or type(input) not in PLAIN
            or type(output) not in PLAIN
        ):
            return False
        if self.riding is not None and "all_to_all_single" in self.checked:
            return self.riding.all_to_all_single(output, input)
        lane = self._lane(engine, ("all_to_all_single", input.dtype))
        if (
            lane is None
            or output.dtype is not input.dtype
            or output.dim() != 1
            or input.dim() != 1
            or output.numel() != input.numel()
            or input.numel() % engine.world_size != 0
            or not serves(engine, lane, input, output)
        ):
            return False
        engine.direct("all_to_all_single", lane, output, input, [], [])
        return True

    def point_to_point(
        self, kind: str, tensor: Any, peer: Any, tag: Any, async_op: bool, timeout: Any
    ) -> bool:
        engine = self.engine
        if engine is None or async_op or timeout is not None or type(tensor) not in PLAIN:
            return False
        lane = self._lane(engine, (kind, tensor.dtype))  # (no check on point to point)
        if (
            lane is None
            or type(peer) is not int
            or not 0 <= peer < engine.world_size
            or peer == engine.rank
            or type(tag) is not int
            or not serves(engine, lane, tensor)
        ):
            return False
        engine.direct_p2p(kind, lane, tensor, peer, tag)
        return True
