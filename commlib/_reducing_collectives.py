"""The collectives that reduce: ``all_reduce``, ``reduce``, ``reduce_scatter``.

Methods of :class:`~commlib.Communicator`, which derives from
:class:`ReducingCollectives`: each is the public method itself (no frame of
its own in between), its first line the fast entry (:mod:`commlib._lanes`),
then its checked branch (the check's round carries the data, reduced in rank
order) or its unchecked one (the engine's call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast, overload

import torch

from commlib import _finite, _nested, _uneven
from commlib import _validation as check
from commlib._collective import collective
from commlib._engine import Engine
from commlib._guard import Guard, finished
from commlib._host_copy import host_clone
from commlib._lanes import Lanes, learn_once
from commlib._settings import as_timedelta
from commlib.backend import Backend
from commlib.handle import Handle
from commlib.reductions import copy_back, reduce_into, reduction, write_back
from commlib.serialization import Serializer
from commlib.types import ReduceOp, Timeout

_Data = TypeVar("_Data")


class ReducingCollectives:
    """``all_reduce``, ``reduce`` and ``reduce_scatter`` of a :class:`~commlib.Communicator`."""

    # what the Communicator holds (its __init__ sets them)
    plugin: Backend
    check_finite: bool
    _lanes: Lanes
    _guard: Guard
    _serializer: Serializer
    _slot_size: int
    _member: Callable[[str], Engine]

    @overload
    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp | str = ...,
        *,
        async_op: bool = ...,
        timeout: Timeout = ...,
    ) -> Handle | None: ...
    @overload
    def all_reduce(
        self,
        tensor: _Data,
        op: ReduceOp | str = ...,
        *,
        async_op: bool = ...,
        timeout: Timeout = ...,
    ) -> _Data: ...
    @collective("all_reduce")
    def all_reduce(
        self,
        tensor: Any,
        op: ReduceOp | str = "sum",
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Any:
        """Reduce ``tensor`` across the group, in place.

        ``op`` is one of ``sum mean product min max band bor bxor``. ``mean`` of
        an integer tensor is computed in floating point and written back into
        the integer tensor (truncated), as mmengine does.

        ``tensor`` may also be a Python number, whose reduced value is
        returned (ignite's ``idist.all_reduce``; an int's ``mean`` is a
        float), or a nested structure of tensors and numbers (dicts, lists,
        tuples, namedtuples, any depth): its tensors are reduced in place and
        the structure is returned, with its numbers reduced. Leaves travel
        packed, one collective per dtype and device. A structure, dtype or
        shape that differs across ranks raises the same
        :class:`~commlib.errors.RemoteArgumentError` on every rank, naming the
        path (``['logits']: rank 1 (3, 10), rank 0 (4, 10)``). ``async_op``
        takes a tensor only.

        Examples:
            >>> x = torch.tensor([1.0, 2.0]) * (comm.rank + 1)
            >>> comm.all_reduce(x, op="mean")   # 2 ranks: tensor([1.5, 3.0])
            >>> comm.all_reduce(comm.rank + 1)  # 2 ranks: 3
            1
            >>> comm.all_reduce({"loss": torch.tensor(0.5), "n": [2, 3]})
            {'loss': tensor(0.5000), 'n': [2, 3]}
        """
        if self._lanes.all_reduce(tensor, op, async_op, timeout):
            return None
        engine = self._member("all_reduce")
        if not isinstance(tensor, torch.Tensor):
            return _nested.all_reduce(self, tensor, op, timeout, async_op=async_op)
        check.tensor(tensor, "tensor")
        name = check.reduce_op(op, tensor)
        engine_op, back = reduction(name, tensor, self.plugin.native_avg)
        work_t, world = engine.to_device(tensor), engine.world_size
        finite = _finite.flag(self.check_finite, tensor)
        if "all_reduce" in self._guard.checked:  # (a checked call takes no lane: none learnt)
            parts = _finite.checked(
                self._guard,
                engine,
                "all_reduce",
                lambda: f"op={name}, {tensor.dtype}, {tuple(tensor.shape)}",
                work_t,
                timeout,
                finite,
                (name, tensor.dtype, tensor.shape),
            )
            if parts is not None:
                reduce_into(work_t, parts, engine_op)
                return write_back(back, work_t, tensor, world, async_op)
        else:
            Lanes.learn_all_reduce(engine, op, name, engine_op, back, tensor)
            if finite is not None:
                _finite.agree_finite(
                    engine, "all_reduce", finite, self._serializer, self._slot_size
                )
        return engine.all_reduce(
            work_t,
            engine_op,
            # nothing to finish when the engine wrote the caller's tensor itself
            finish=None
            if back is copy_back and work_t is tensor
            else lambda: back(work_t, tensor, world),
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[tensor],
        )

    @collective("reduce_scatter")
    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor | Sequence[torch.Tensor],
        op: ReduceOp | str = "sum",
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Reduce ``input`` across ranks and leave chunk ``rank`` in ``output``.

        ``input`` is a list of ``world_size`` tensors shaped like ``output``, or
        one tensor of ``world_size`` such chunks along dim 0.

        Chunks may differ in size (MPI's ``Reduce_scatter`` with counts,
        torchcomms' ``reduce_scatter_v``): ``input[i]`` is rank ``i``'s chunk,
        every rank passes the same list of shapes, and each rank's ``output``
        is shaped like its own chunk. The engine's reduce_scatter then runs
        on chunks padded to the largest.

        Examples:
            >>> out = torch.empty(1)
            >>> comm.reduce_scatter(out, torch.ones(comm.world_size))
            >>> out
            tensor([1.])
            >>> sizes = [r + 1 for r in range(comm.world_size)]   # rank r keeps r + 1 values
            >>> out = torch.empty(comm.rank + 1)
            >>> comm.reduce_scatter(out, [torch.ones(n) for n in sizes])
            >>> out
            tensor([1.])
        """
        if self._lanes.reduce_scatter(output, input, op, async_op, timeout):
            return None
        engine = self._member("reduce_scatter")
        check.tensor(output, "output")
        world = engine.world_size
        flat = check.reduce_scatter_input(output, input, world)
        if flat is None:  # tensors of different shapes
            chunks = cast(list, input)
            return _uneven.reduce_scatter_v(
                self._guard, engine, output, chunks, op, async_op, timeout
            )
        name = check.reduce_op(op, output)
        engine_op, back = reduction(name, output, self.plugin.native_avg)
        out_t = engine.to_device(output)
        if out_t.dim() != 1:
            out_t = out_t.view(-1)  # contiguous, so a view
        in_t = engine.to_device(flat)
        guard = self._guard
        if "reduce_scatter" in guard.checked:
            # chunk j of every rank's input travels to rank j alone (in the row that goes
            # there): the parts are every rank's chunk for this rank, reduced in rank order
            parts = guard.check(
                engine,
                "reduce_scatter",
                lambda: f"op={name}, {output.dtype}, {tuple(output.shape)}",
                in_t.view(world, -1),
                timeout,
                apart=True,
                key=(name, output.dtype, output.shape),
            )
            if parts is not None:
                reduce_into(out_t, parts, engine_op)
                return write_back(back, out_t, output, world, async_op)
        elif engine_op == op:  # (a checked call takes no lane: none learnt)
            learn_once(engine, "reduce_scatter", op=engine_op, dtype=output.dtype)
        return engine.reduce_scatter(
            out_t,
            in_t,
            engine_op,
            finish=None
            if back is copy_back and out_t is output
            else lambda: back(out_t, output, world),
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[output],
        )

    @collective("reduce")
    def reduce(
        self,
        tensor: torch.Tensor,
        dst: int = 0,
        op: ReduceOp | str = "sum",
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Reduce ``tensor`` across the group into ``tensor`` on ``dst``, in place.

        ``op`` is any op :meth:`all_reduce` takes, ``mean`` included. On the
        other ranks ``tensor`` is left as it was (engines may use the buffer
        they are given there as scratch space, so they get a copy).

        Examples:
            >>> x = torch.tensor([1.0, 2.0]) * (comm.rank + 1)
            >>> comm.reduce(x, dst=0, op="sum")
            >>> x                 # on rank 0 of 2 ranks: tensor([3., 6.])
            tensor([1., 2.])
        """
        if self._lanes.reduce(tensor, dst, op, async_op, timeout):
            return None
        engine = self._member("reduce")
        check.tensor(tensor, "tensor")
        check.rank_in_range(dst, engine.world_size, "dst")
        name = check.reduce_op(op, tensor)
        engine_op, back = reduction(name, tensor, self.plugin.native_avg)
        work_t = engine.to_device(tensor)
        world = engine.world_size
        is_dst = engine.rank == dst
        guard = self._guard
        finite = _finite.flag(self.check_finite, tensor)
        if "reduce" in guard.checked:
            parts = _finite.checked(
                guard,
                engine,
                "reduce",
                lambda: f"dst={dst}, op={name}, {tensor.dtype}, {tuple(tensor.shape)}",
                work_t,
                timeout,
                finite,
                (dst, name, tensor.dtype, tensor.shape),
            )
            if parts is not None:
                if not is_dst:
                    return finished(lambda: None, async_op, [tensor]) if async_op else None
                reduce_into(work_t, parts, engine_op)
                return write_back(back, work_t, tensor, world, async_op)
        else:
            if engine_op == op:  # (a checked call takes no lane: none learnt)
                learn_once(engine, "reduce", op=engine_op, dst=dst, dtype=tensor.dtype)
            if finite is not None:
                _finite.agree_finite(engine, "reduce", finite, self._serializer, self._slot_size)
        finish = None
        if not is_dst:
            if work_t is tensor:
                work_t = host_clone(tensor)
        elif back is not copy_back or work_t is not tensor:
            finish = lambda: back(work_t, tensor, world)  # noqa: E731
        return engine.reduce(
            work_t,
            dst,
            engine_op,
            finish=finish,
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[tensor],
        )
