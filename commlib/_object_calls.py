"""The object collectives' calls: a world of one answers at once; elsewhere their steps run.

Each ``Communicator`` object collective checks that this process is a member,
then hands its arguments here as one :class:`ObjectCall`: the serializer it
loads with is chosen (``weights_only=True``: the restricted loading), the
first round's slot sized as the group's slot learnt (:mod:`commlib._rooms`),
and the protocol's steps (:mod:`commlib._objects`, :mod:`commlib._p2p_objects`,
:mod:`commlib._scatter_objects`) run, or start where ``async_op=True`` (a
:class:`~commlib.handle.ResultHandle` whose ``wait()`` gives the result).

Examples:
    >>> call = ObjectCall(engine, None, serializer, False, 4096, None, False)
    >>> all_gather_object(call, {"rank": 0})
    [{'rank': 0}]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from commlib import _objects, _p2p_objects, _rooms, _scatter_objects, _steps
from commlib import _validation as check
from commlib._settings import as_timedelta
from commlib.serialization import Serializer, object_serializer

if TYPE_CHECKING:
    from commlib._engine import Engine
    from commlib.types import Timeout


@dataclasses.dataclass(frozen=True)
class ObjectCall:
    """One object collective's call: the member's engine and the call's settings."""

    engine: Engine
    serializer: Serializer | None  # the call's own, or None: the communicator's
    default: Serializer  # the communicator's
    weights_only: bool
    slot_size: int  # the communicator's slot size
    timeout: Timeout
    async_op: bool

    def chosen(self) -> Serializer:
        """The serializer the call uses (:func:`commlib.serialization.object_serializer`)."""
        return object_serializer(self.serializer, self.default, self.weights_only)

    def first_slot(self) -> int:
        """Bytes of each rank's slot in the first round: the size the group's slot learnt.

        As the tensor checks and ``all_gather`` use: ranks that call different
        collectives still send the same number of bytes, and find out instead
        of aborting.
        """
        return _rooms.rooms_of(self.engine).slot_bytes(self.slot_size)

    def run(self, steps: _steps.Steps[Any]) -> Any:
        """Run ``steps`` (or start them, for ``async_op``) under the call's timeout."""
        limit = as_timedelta(self.timeout)
        if self.async_op:
            return _steps.start(self.engine, steps, limit)
        return _steps.run(self.engine, steps, limit)

    def done(self, value: Any) -> Any:
        """``value`` as the call returns it in a world of one (a finished handle for async)."""
        return _steps.done(value) if self.async_op else value


def all_gather_object(call: ObjectCall, obj: Any) -> Any:
    """``Communicator.all_gather_object``'s body: every rank's ``obj``, by rank."""
    engine = call.engine
    if engine.world_size == 1:  # as mmengine: nothing to serialize in a world of one
        return call.done([obj])
    steps = _objects.all_gather_object_steps(engine, obj, call.chosen(), call.first_slot())
    return call.run(steps)


def gather_object(call: ObjectCall, obj: Any, dst: int) -> Any:
    """``Communicator.gather_object``'s body: every rank's ``obj`` on ``dst``."""
    engine = call.engine
    if engine.world_size == 1:
        check.rank_in_range(dst, 1, "dst")
        return call.done([obj])
    steps = _objects.gather_object_steps(engine, obj, dst, call.chosen(), call.first_slot())
    return call.run(steps)


def broadcast_object_list(call: ObjectCall, object_list: list[Any], src: int) -> Any:
    """``Communicator.broadcast_object_list``'s body: ``src``'s objects into ``object_list``."""
    engine = call.engine
    if engine.world_size == 1:
        if not isinstance(object_list, list):
            raise TypeError(
                f"broadcast_object_list needs a list, got {type(object_list).__name__}"
            )
        check.rank_in_range(src, 1, "src")
        return call.done(None)
    steps = _objects.broadcast_object_list_steps(
        engine, object_list, src, call.chosen(), call.first_slot()
    )
    return call.run(steps)


def broadcast_object(call: ObjectCall, obj: Any, src: int) -> Any:
    """``Communicator.broadcast_object``'s body: ``src``'s ``obj`` on every rank."""
    engine = call.engine
    if engine.world_size == 1:
        check.rank_in_range(src, 1, "src")
        return call.done(obj)
    box = [obj]
    steps = _objects.broadcast_object_list_steps(
        engine, box, src, call.chosen(), call.first_slot()
    )
    return call.run(_steps.first_of(steps, box))


def scatter_object_list(
    call: ObjectCall, output_list: list[Any], input_list: Sequence[Any] | None, src: int
) -> Any:
    """``Communicator.scatter_object_list``'s body: ``input_list[i]`` of ``src`` to rank ``i``."""
    engine = call.engine
    if engine.world_size == 1:
        _scatter_objects.check_arguments(output_list, input_list, src, 1, 0)
        assert input_list is not None
        output_list[0] = input_list[0]
        return call.done(None)
    steps = _scatter_objects.scatter_object_list_steps(
        engine, output_list, input_list, src, call.chosen(), call.first_slot()
    )
    return call.run(steps)


def send_object_list(call: ObjectCall, object_list: list[Any], dst: int) -> Any:
    """``Communicator.send_object_list``'s body: ``object_list`` to rank ``dst``."""
    engine = call.engine
    check.peer(dst, engine.world_size, engine.rank, "dst")
    steps = _p2p_objects.send_object_list_steps(
        engine, object_list, dst, call.chosen(), call.slot_size
    )
    return call.run(steps)


def recv_object_list(call: ObjectCall, object_list: list[Any], src: int) -> Any:
    """``Communicator.recv_object_list``'s body: what rank ``src`` sends, into ``object_list``."""
    engine = call.engine
    check.peer(src, engine.world_size, engine.rank, "src")
    steps = _p2p_objects.recv_object_list_steps(
        engine, object_list, src, call.chosen(), call.slot_size
    )
    return call.run(steps)
