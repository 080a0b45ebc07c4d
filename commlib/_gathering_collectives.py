"""The collectives that gather: ``all_gather``, ``all_gather_into_tensor``, ``gather``, ...

Methods of :class:`~commlib.Communicator`, which derives from
:class:`GatheringCollectives`: each is the public method itself (no frame of
its own in between). Tensors whose shapes differ across ranks travel by
:mod:`commlib._ragged` (their shapes, and small ones whole, in one round);
``all_gather_shapes`` and ``all_gather_cat`` are composed on the same round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast, overload

import torch

from commlib import _nested, _ragged, _rooms
from commlib import _validation as check
from commlib._collective import collective
from commlib._engine import Engine
from commlib._guard import Guard
from commlib._lanes import Lanes, learn_once
from commlib._settings import as_timedelta
from commlib.handle import Handle
from commlib.reductions import copy_back, write_back
from commlib.types import Timeout

_Data = TypeVar("_Data")


class GatheringCollectives:
    """``all_gather`` and its kin of a :class:`~commlib.Communicator`."""

    # what the Communicator holds (its __init__ sets them)
    _lanes: Lanes
    _guard: Guard
    _slot_size: int
    _member: Callable[[str], Engine]

    @collective("all_gather_shapes")
    def all_gather_shapes(
        self, tensor: torch.Tensor, *, timeout: Timeout = None
    ) -> list[list[int]]:
        """Every rank's shape of ``tensor`` (same dtype and number of dims everywhere).

        Examples:
            >>> comm.all_gather_shapes(torch.zeros(3, 2))
            [[3, 2]]
        """
        engine = self._member("all_gather_shapes")
        check.tensor(tensor, "tensor")
        shapes, _, _ = _ragged.exchange(
            engine,
            engine.to_device(tensor),
            "all_gather_shapes",
            room=_ragged.inline_room(self._slot_size),
            timeout=as_timedelta(timeout),
            rooms=_rooms.rooms_of(engine),
            shapes_only=True,
        )
        return [list(s) for s in shapes]  # one list per rank, the caller's to change

    @collective("all_gather_cat")
    def all_gather_cat(self, data: _Data, dim: int = 0, *, timeout: Timeout = None) -> _Data:
        """Every rank's ``data`` concatenated along ``dim``, leaf by leaf, in rank order.

        ``data`` is a tensor or a nested structure of them (dicts, lists,
        tuples, namedtuples); every leaf may have a different length along
        ``dim`` on each rank (the last, shorter batch of an evaluation loop),
        and comes back exactly: nothing is padded, nothing dropped or
        duplicated. Structure, dtypes and the other dims must match across
        ranks; where they differ every rank raises the same
        :class:`~commlib.errors.RemoteArgumentError` naming the path. Leaves
        of one dtype travel together, one ``all_gather`` each (as
        accelerate's ``gather``, which pads instead).

        Examples:
            >>> out = comm.all_gather_cat({"pred": torch.arange(comm.rank + 2)})
            >>> out                # 2 ranks: {'pred': tensor([0, 1, 0, 1, 2])}
            {'pred': tensor([0, 1])}
        """
        self._member("all_gather_cat")
        return cast(_Data, _nested.all_gather_cat(self, data, dim, timeout))

    @overload
    def all_gather(
        self, tensor: torch.Tensor, *, timeout: Timeout = ..., adapt_empty: bool = ...
    ) -> list[torch.Tensor]: ...
    @overload
    def all_gather(
        self, tensor: _Data, *, timeout: Timeout = ..., adapt_empty: bool = ...
    ) -> list[_Data]: ...
    @collective("all_gather")
    def all_gather(
        self, tensor: Any, *, timeout: Timeout = None, adapt_empty: bool = False
    ) -> list[Any]:
        """Every rank's ``tensor``, as a list indexed by rank.

        ``tensor`` may also be a Python value (a number, a string, any
        picklable object: ignite's ``idist.all_gather``) or a nested
        structure of tensors and values: the list then holds every rank's
        structure. The structure and the dtypes and dims of its tensors must
        match across ranks (the same :class:`~commlib.errors.RemoteArgumentError`
        on every rank names the path where they do not); shapes may differ.
        Its tensors travel packed, one ragged all_gather per dtype and device.

        Ranks may pass tensors of different shapes (same number of dims, same
        dtype); each rank receives every rank's true tensor. Results are on the
        caller's device. Tensors that fit ``slot_size`` travel with their
        shapes in one round, larger ones in two; the slot learns steady shapes
        (up to 1 MiB per rank), so a loop of them costs one round per call.

        This rank's own entry is ``tensor`` itself, not a copy, so autograd
        flows through it (a metric used as a loss keeps its gradient, as with
        torchmetrics' own gather); the other entries are new tensors.

        With ``adapt_empty``, a rank whose ``tensor`` has no elements may pass
        any dtype and number of dims: its entry, on every rank, is an empty
        tensor of the dtype the ranks with data agree on, shaped ``(0, *the
        trailing dims of the first rank with data)`` (a rank that saw no data
        and holds a placeholder, as torchmetrics' list states do). Every rank
        passes the same ``adapt_empty``; where they differ, every rank raises
        :class:`~commlib.errors.RemoteArgumentError`.

        Examples:
            >>> comm.all_gather(torch.arange(comm.rank + 1))
            [tensor([0])]
            >>> # on 2 ranks, each rank gets: [tensor([0]), tensor([0, 1])]
        """
        found = _ragged.steady_all_gather(
            self._lanes, tensor, timeout, adapt_empty, self._slot_size
        )
        if isinstance(found, list):  # a steady kind of call: its prepared round
            return found
        engine = self._member("all_gather")
        if not isinstance(tensor, torch.Tensor):
            return _nested.all_gather(self, tensor, timeout)
        check.tensor(tensor, "tensor")
        world = engine.world_size
        # no check's round of its own, in any mode: the gathering round is the check (its
        # slots are fixed-size; ranks agree there on dtypes, dims and adapt_empty)
        work_t = engine.to_device(tensor)
        limit = as_timedelta(timeout)
        # (a prepared round that found shapes that differ: its exchange, to go on from)
        shapes, out, dtype = found or _ragged.exchange(
            engine,
            work_t,
            "all_gather",
            room=_ragged.inline_room(self._slot_size),
            timeout=limit,
            rooms=_rooms.rooms_of(engine),
            adapt_empty=adapt_empty,
        )
        me = engine.rank
        if work_t.dtype != dtype or work_t.dim() != len(shapes[me]):  # an adapted empty one
            tensor = torch.empty(shapes[me], dtype=dtype, device=tensor.device)
            work_t = engine.to_device(tensor)
        if out is not None:  # small: the data came with the shapes, one round
            pass
        elif all(s == shapes[0] for s in shapes):
            # one flat buffer: cheaper on the engines than a list of outputs
            flat = torch.empty((world, *work_t.shape), dtype=work_t.dtype, device=work_t.device)
            engine.all_gather_into_tensor(
                flat.view(-1), work_t.reshape(-1), what="all_gather", timeout=limit
            )
            out = list(flat.unbind(0))
        else:
            max_shape = [max(dims) for dims in zip(*shapes)]
            padded = work_t.new_zeros(max_shape)
            padded[tuple(slice(0, d) for d in work_t.shape)] = work_t
            buf = [torch.empty_like(padded) for _ in range(world)]
            engine.all_gather(buf, padded, timeout=limit)
            out = [b[tuple(slice(0, d) for d in s)] for b, s in zip(buf, shapes)]
        if engine.on_cpu and tensor.is_cpu:  # where the caller's tensor is already
            out[me] = tensor
            return out
        return [tensor if r == me else t.to(tensor.device) for r, t in enumerate(out)]

    @collective("all_gather_into_tensor")
    def all_gather_into_tensor(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Concatenate every rank's ``tensor`` along dim 0 into ``output``.

        ``output`` must hold ``world_size`` times ``tensor``'s elements.

        Examples:
            >>> out = torch.empty(comm.world_size * 2)
            >>> comm.all_gather_into_tensor(out, torch.ones(2) * comm.rank)
        """
        if self._lanes.all_gather_into_tensor(output, tensor, async_op, timeout):
            return None
        engine = self._member("all_gather_into_tensor")
        check.tensor(output, "output")
        check.tensor(tensor, "tensor")
        if output.numel() != tensor.numel() * engine.world_size:
            raise ValueError(
                f"output has {output.numel()} elements; all_gather_into_tensor needs "
                f"world_size ({engine.world_size}) x {tensor.numel()}"
            )
        if output.dtype != tensor.dtype:
            raise TypeError(
                f"output dtype {output.dtype} differs from tensor dtype {tensor.dtype}"
            )
        out_t = engine.to_device(output)
        in_t = engine.to_device(tensor)
        world = engine.world_size
        guard = self._guard
        if "all_gather_into_tensor" in guard.checked:
            parts = guard.check(
                engine,
                "all_gather_into_tensor",
                lambda: f"{tensor.dtype}, {tuple(tensor.shape)}",
                in_t,
                timeout,
                key=(tensor.dtype, tensor.shape),
            )
            if parts is not None:
                if out_t.dim() == 1 == in_t.dim():
                    torch.cat(parts, out=out_t)  # one op, no view
                else:
                    torch.stack(parts, out=out_t.view(world, *parts[0].shape))
                return write_back(copy_back, out_t, output, world, async_op)
        else:  # (a checked call takes no lane: none learnt)
            learn_once(engine, "all_gather_into_tensor", dtype=tensor.dtype)
        return engine.all_gather_into_tensor(
            # flat views: engines such as gloo insist on matching shapes, and
            # the contract is about element counts (a view of a 1-dim tensor is
            # the tensor's own shape: no view op for it)
            out_t if out_t.dim() == 1 else out_t.view(-1),
            in_t if in_t.dim() == 1 else in_t.view(-1),
            finish=None if out_t is output else lambda: copy_back(out_t, output, world),
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[output],
        )

    @collective("gather")
    def gather(
        self, tensor: torch.Tensor, dst: int = 0, *, timeout: Timeout = None
    ) -> list[torch.Tensor]:
        """Every rank's ``tensor`` on ``dst`` (a list); other ranks get ``[]``.

        Ranks may pass tensors of different shapes (same dtype and number of
        dims: MPI's ``Gatherv``, torchcomms' ``gather_v``); ``dst`` receives
        every rank's true tensor. As in :meth:`all_gather`, the first round
        carries every rank's shape, and small tensors with it (one round);
        larger ones follow in the engine's gather, padded to the largest
        shape where shapes differ and cut back on ``dst``. A dtype, number of
        dims or ``dst`` that differs across ranks raises the same
        :class:`~commlib.errors.RemoteArgumentError` on every rank.

        Examples:
            >>> comm.gather(torch.tensor([comm.rank]), dst=0)
            [tensor([0])]
            >>> # on 2 ranks: [tensor([0]), tensor([1])] on rank 0, [] on rank 1
            >>> comm.gather(torch.arange(comm.rank + 1))   # uneven: [tensor([0]), tensor([0, 1])]
            [tensor([0])]
        """
        found = _ragged.steady_gather(self._lanes, tensor, dst, timeout, self._slot_size)
        if isinstance(found, list):  # a steady kind of call: its prepared round
            return found
        engine = self._member("gather")
        check.tensor(tensor, "tensor")
        check.rank_in_range(dst, engine.world_size, "dst")
        work_t = engine.to_device(tensor)
        is_dst = engine.rank == dst
        limit = as_timedelta(timeout)
        # (a prepared round that found shapes that differ: its exchange, to go on from)
        shapes, parts, _ = found or _ragged.exchange(
            engine,
            work_t,
            "gather",
            room=_ragged.inline_room(self._slot_size),
            timeout=limit,
            rooms=_rooms.rooms_of(engine),
            dst=dst,
        )
        if parts is not None:  # small: the data came with the shapes, one round
            if not is_dst:
                return []
            # views of this call's own gathered buffer: nothing else holds it
            if engine.on_cpu and tensor.is_cpu:
                return parts
            return [p.to(tensor.device) for p in parts]
        mine = list(work_t.shape)
        if all(s == mine for s in shapes):
            out = [torch.empty_like(work_t) for _ in shapes] if is_dst else None
            engine.gather(work_t, out, dst, timeout=limit)
            if out is None:
                return []
            if engine.on_cpu and tensor.is_cpu:  # where the caller's tensor is already
                return out
            return [t.to(tensor.device) for t in out]
        # uneven: the engine's gather of the largest shape, each rank's part cut back
        largest = [max(dims) for dims in zip(*shapes)]
        padded = work_t.new_zeros(largest)
        padded[tuple(slice(0, d) for d in mine)] = work_t
        out = [torch.empty_like(padded) for _ in shapes] if is_dst else None
        engine.gather(padded, out, dst, timeout=limit)
        if out is None:
            return []
        return [t[tuple(slice(0, d) for d in s)].to(tensor.device) for t, s in zip(out, shapes)]

    @collective("gather_into_tensor")
    def gather_into_tensor(
        self,
        tensor: torch.Tensor,
        gather_tensor: torch.Tensor | None = None,
        dst: int = 0,
        *,
        timeout: Timeout = None,
    ) -> None:
        """Every rank's ``tensor`` into one tensor on ``dst``, rank after rank (torch 2.14's).

        ``gather_tensor`` holds world_size x ``tensor``'s elements (flat, or
        stacked as ``(world_size, *tensor.shape)``) and is needed on ``dst``
        alone; the other ranks may pass ``None``. Every rank passes the same
        shape and dtype. Composed on the engine's ``gather``, so it serves on
        every torch commlib supports (2.13 has no such call).

        Examples:
            >>> out = torch.zeros(2 * comm.world_size)
            >>> comm.gather_into_tensor(torch.tensor([1.0, 2.0]), out)
            >>> out                            # 2 ranks, on rank 0: tensor([1., 2., 1., 2.])
            tensor([1., 2.])
        """
        engine = self._member("gather_into_tensor")
        check.tensor(tensor, "tensor")
        world = engine.world_size
        check.rank_in_range(dst, world, "dst")
        output = None
        if engine.rank == dst:  # the others wait for dst: a mistake here reaches them
            output = check.gathered_output(gather_tensor, tensor, world, "gather_into_tensor")
        self._guard.check(
            engine,
            "gather_into_tensor",
            lambda: f"dst={dst}, {tensor.dtype}, {tuple(tensor.shape)}",
            timeout=timeout,
            key=(dst, tensor.dtype, tensor.shape),
        )
        work_t = engine.to_device(tensor)
        out_t = None if output is None else engine.to_device(output)
        rows = None if out_t is None else list(out_t.view(world, *work_t.shape).unbind(0))
        engine.gather(work_t, rows, dst, timeout=as_timedelta(timeout))
        if output is not None and out_t is not None:
            copy_back(out_t, output, world)
