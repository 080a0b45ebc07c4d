"""Checked calls' fast entries: a steady checked call straight to its prepared round.

A checked collective goes the whole way on every call: the communicator's
validation, the guard's look-up of the round its kind prepared
(:class:`commlib._check_round.Round`), the round, then the engine's
collective where the data did not ride. Where a plugin sets
``checked_lanes = True`` (mpi: there the check cannot come off; gloo: its
round goes through shared memory on one machine; on both the check's host
work is most of a small call), a blocking call with the
communicator's timeout whose kind already has a prepared round takes it
from :class:`commlib._lanes.Lanes`' entry instead: the round prepared by an
earlier call with the same key stands for arguments that passed this
rank's validation, as a learnt lane does for unchecked calls. What changes
is only this rank's host work: the same header goes out in the same round,
every rank compares every row's header, a mismatch raises the same
:class:`~commlib.errors.RemoteArgumentError` on every rank, the data rides
(and completes in rank order) exactly where the guard would let it, and
larger data follows in the engine's own collective, the one the plugin's
lane issues (:meth:`~commlib.Backend.direct_call`), waited in slices.

A miss (no round yet, another shape, dtype, root or op spelling, a
``mean``, a tensor needing grad, a non-contiguous one, NaN checks on, an
open coalescing manager, no lane for the data's collective) returns
``False`` before anything is sent, and the communicator's method goes the
whole way.

Examples:
    >>> comm = commlib.Communicator()          # single: no checked lanes
    >>> comm._lanes.riding is None
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from commlib import _lanes, _nested, _steps
from commlib import _validation as check
from commlib._check_round import steady
from commlib._guard import write_nothing
from commlib._host_copy import (
    PARALLEL_FROM,
    copy_bytes,
    host_clone,
    host_copy,
    is_plain_memory,
    stack_into,
)
from commlib._sent_slots import LAYOUTS
from commlib.errors import RemoteArgumentError
from commlib.reductions import reduce_into

if TYPE_CHECKING:
    from collections.abc import Hashable

    from commlib._check_round import HostSlots, Round
    from commlib._engine import Engine
    from commlib._guard import Guard
    from commlib.backend import DirectCall


def checked_lanes(engine: Engine | None, guard: Guard) -> CheckedLanes | None:
    """The checked entries of a communicator's lanes, where its plugin has them.

    Only on the host, where the guard checks something, and where the plugin
    sets ``checked_lanes`` (mpi, gloo).

    Examples:
        >>> checked_lanes(comm._engine, comm._guard) is None   # single: none
        True
    """
    if engine is None or not guard.checked or not engine.on_cpu:
        return None
    if not getattr(engine.plugin, "checked_lanes", False):
        return None
    return CheckedLanes(engine, guard)


class CheckedLanes:
    """One communicator's checked fast entries (for the collectives its guard checks).

    Each takes the call's arguments (already plain tensors, a blocking call,
    no timeout of its own: :class:`~commlib._lanes.Lanes` checked that) and
    says whether it ran the call.
    """

    __slots__ = ("engine", "follows", "guard", "rides", "serializer")

    def __init__(self, engine: Engine, guard: Guard):
        self.engine = engine
        self.guard = guard
        self.serializer = guard.serializer
        #: each prepared round's lane for the data that does not ride in it
        self.follows: dict[Round, DirectCall] = {}
        #: the collectives whose small data completes in the check's round
        self.rides = guard.completed_by_check

    def _riding(self, what: str, tensor: torch.Tensor) -> torch.Tensor | None:
        # the data the guard would let ride (Guard.check's completes)
        if what not in self.rides:
            return None
        most = self.engine.completed_by_check_bytes
        return None if most is not None and tensor.nbytes > most else tensor

    def _lane(self, what: str, tensor: torch.Tensor, **key: Any) -> DirectCall | None:
        # the engine's collective after a round the data did not ride in
        engine = self.engine
        table = (what, *key.values())
        lane = engine.lanes[table] if table in engine.lanes else _lanes.learn(engine, what, **key)
        if lane is None or not _lanes.serves(engine, lane, tensor):
            return None
        return lane

    def _ready(
        self,
        host: HostSlots,
        what: str,
        key: Hashable,
        data: torch.Tensor | None,
        copies: bool,
        tensor: torch.Tensor,
        apart: bool = False,
        **lane_key: Any,
    ) -> tuple[Round, DirectCall | None] | None:
        # the prepared round, and the engine's lane (keyed by ``lane_key``, for ``tensor``)
        # where the data does not ride: None before anything is sent, if either is missing.
        # The guard's steady look-up first (Guard.check), for a call whose data is declared
        prep = host.rounds.get((what, key))
        if (
            prep is None
            or prep.learnt != host.rooms.learnt
            or prep.floor != self.guard.slot_size
            or prep.apart is not apart
            or prep.copies is not copies
        ):
            return None
        if prep.dtype is None:
            if data is not None:
                return None
        elif data is None or data.dtype is not prep.dtype or data.shape != prep.shape:
            return None
        if prep.inline:
            return prep, None
        # (no data declared, or past the slot): the lane found for this round before, if
        # any (its key and byte count are the round's, the tensor is taken: _lanes.takes)
        lane = self.follows.get(prep)
        if lane is None:
            lane = self._lane(what, tensor, **lane_key)
            if lane is None:
                return None
            if len(self.follows) >= LAYOUTS:
                self.follows.clear()
            self.follows[prep] = lane
        elif lane.unless_in and self.engine.group in lane.unless_in:
            return None  # an open coalescing manager (_lanes.serves)
        return prep, lane

    def _both(self, output: torch.Tensor, input: torch.Tensor) -> HostSlots | None:
        # the prepared rounds for a call of an output and an input tensor, where the entry
        # may take it (what the communicator's validation checks every call: one dtype,
        # both taken as they are, the output outside autograd); no async protocol unfinished
        engine = self.engine
        host: HostSlots | None = engine.kept.get("check")
        if (
            host is None
            or _steps.unfinished
            or output.requires_grad
            or output.dtype is not input.dtype
            or not _lanes.takes(engine, input)
            or not _lanes.takes(engine, output)
        ):
            return None
        return host

    def all_reduce(self, tensor: torch.Tensor, op: str) -> bool:
        """A steady checked ``all_reduce`` of ``tensor`` with ``op`` (not ``mean``), if it serves.

        Examples:
            >>> comm._lanes.riding.all_reduce(torch.ones(2), "sum")  # doctest: +SKIP
            True
        """
        engine = self.engine
        host: HostSlots | None = engine.kept.get("check")
        if host is None or op == "mean" or tensor.requires_grad or _steps.unfinished:
            return False
        if not _lanes.takes(engine, tensor):
            return False
        data = self._riding("all_reduce", tensor)
        dtype = tensor.dtype
        key = (op, dtype, tensor.shape)
        ready = self._ready(host, "all_reduce", key, data, True, tensor, op=op, dtype=dtype)
        if ready is None:
            return False
        prep, lane = ready
        parts = steady(engine, host, prep, "all_reduce", self.serializer, data, None, None)
        if parts is not None:
            reduce_into(tensor, parts, op)  # every rank alike, in rank order
        elif lane is not None:
            engine.direct("all_reduce", lane, [tensor])
        return True

    def broadcast(self, tensor: torch.Tensor, src: int) -> bool:
        """A steady checked ``broadcast`` of ``tensor`` from ``src``, if it serves.

        Examples:
            >>> comm._lanes.riding.broadcast(torch.ones(2), 0)  # doctest: +SKIP
            True
        """
        engine = self.engine
        host: HostSlots | None = engine.kept.get("check")
        if host is None or tensor.requires_grad or _steps.unfinished:
            return False
        if not _lanes.takes(engine, tensor):
            return False
        data = self._riding("broadcast", tensor)
        root = engine.rank == src
        dtype = tensor.dtype
        key = (src, dtype, tensor.shape)
        ready = self._ready(host, "broadcast", key, data, root, tensor, src=src, dtype=dtype)
        if ready is None:
            return False
        prep, lane = ready
        write = None if root else write_nothing
        try:
            parts = steady(engine, host, prep, "broadcast", self.serializer, data, None, write)
        except RemoteArgumentError as exc:  # as the communicator words it
            raise _nested.tensor_meets_no_tensor(exc, src) from None
        if parts is not None:
            if not root:
                _part_into(tensor, parts[src])
        elif lane is not None:
            engine.direct("broadcast", lane, [tensor])
        return True

    def reduce(self, tensor: torch.Tensor, dst: int, op: str) -> bool:
        """A steady checked ``reduce`` of ``tensor`` to ``dst`` with ``op`` (not ``mean``).

        Examples:
            >>> comm._lanes.riding.reduce(torch.ones(2), 0, "sum")  # doctest: +SKIP
            True
        """
        engine = self.engine
        host: HostSlots | None = engine.kept.get("check")
        if host is None or op == "mean" or tensor.requires_grad or _steps.unfinished:
            return False
        if not _lanes.takes(engine, tensor):
            return False
        data = self._riding("reduce", tensor)
        dtype = tensor.dtype
        key = (dst, op, dtype, tensor.shape)
        ready = self._ready(host, "reduce", key, data, True, tensor, op=op, dst=dst, dtype=dtype)
        if ready is None:
            return False
        prep, lane = ready
        parts = steady(engine, host, prep, "reduce", self.serializer, data, None, None)
        is_dst = engine.rank == dst
        if parts is not None:
            if is_dst:
                reduce_into(tensor, parts, op)  # in rank order, as every rank would
        elif lane is not None:
            # the engine may use the buffer of a rank other than dst as scratch space
            engine.direct("reduce", lane, [tensor if is_dst else host_clone(tensor)])
        return True

    def all_gather_into_tensor(self, output: torch.Tensor, tensor: torch.Tensor) -> bool:
        """A steady checked ``all_gather_into_tensor`` of ``tensor`` into ``output``.

        Examples:
            >>> comm._lanes.riding.all_gather_into_tensor(out, torch.ones(2))  # doctest: +SKIP
            True
        """
        engine = self.engine
        host = self._both(output, tensor)
        # the output's size too (the round's key names the input alone)
        if host is None or output.numel() != tensor.numel() * engine.world_size:
            return False
        what = "all_gather_into_tensor"
        data = self._riding(what, tensor)
        ready = self._ready(
            host, what, (tensor.dtype, tensor.shape), data, True, tensor, dtype=tensor.dtype
        )
        if ready is None:
            return False
        prep, lane = ready
        parts = steady(engine, host, prep, what, self.serializer, data, None, None)
        if parts is not None:
            if is_plain_memory(output):
                # every rank's part back to back (world parts of one dtype; plain copies:
                # torch's cat is its dispatcher's, cold after a sleep, _host_copy)
                copy_bytes(output.data_ptr(), parts, tensor.nbytes)
            elif output.dim() == 1 == tensor.dim():
                torch.cat(parts, out=output)
            else:
                torch.stack(parts, out=output.view(engine.world_size, *tensor.shape))
        elif lane is not None:
            flat = output if output.dim() == 1 else output.view(-1)
            engine.direct(what, lane, flat, tensor if tensor.dim() == 1 else tensor.view(-1))
        return True

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str) -> bool:
        """A steady checked ``reduce_scatter`` of one ``input`` tensor into ``output``.

        Examples:
            >>> comm._lanes.riding.reduce_scatter(out, torch.ones(4), "sum")  # doctest: +SKIP
            True
        """
        engine = self.engine
        world = engine.world_size
        host = None if op == "mean" else self._both(output, input)
        # the input's size too (the key names the output)
        if host is None or input.numel() != output.numel() * world:
            return False
        what = "reduce_scatter"
        # chunk j for rank j: every rank's chunk for this one comes back, reduced in rank order
        data = self._riding(what, input)
        chunks = None if data is None else data.view(world, -1)
        key = (op, output.dtype, output.shape)
        ready = self._ready(
            host, what, key, chunks, True, output, apart=True, op=op, dtype=output.dtype
        )
        if ready is None:
            return False
        prep, lane = ready
        parts = steady(engine, host, prep, what, self.serializer, chunks, None, None)
        out = output if output.dim() == 1 else output.view(-1)
        if parts is not None:
            reduce_into(out, parts, op)
        elif lane is not None:
            engine.direct(what, lane, out, input if input.dim() == 1 else input.view(-1))
        return True

    def scatter(self, tensor: torch.Tensor, scatter_list: Any, src: int) -> bool:
        """A steady checked ``scatter`` into ``tensor`` from ``src`` (its list on ``src``).

        Examples:
            >>> comm._lanes.riding.scatter(out, [torch.ones(2)] * 2, 0)  # doctest: +SKIP
            True
        """
        engine = self.engine
        host: HostSlots | None = engine.kept.get("check")
        if host is None or tensor.requires_grad or _steps.unfinished:
            return False
        if not _lanes.takes(engine, tensor):
            return False
        root = engine.rank == src
        # what the communicator's validation checks every call on src: the list
        if root and not _lanes.plain_list(engine, scatter_list, tensor):
            return False
        what = "scatter"
        if what not in self.rides:
            return False  # (the check alone, then the engine's: not prepared here)
        # src's piece for each rank rides in the row for it (the rows only declared)
        rows = self.guard.rows(tensor.dtype, tensor.shape, engine.world_size)
        data = self._riding(what, rows)
        key = (src, tensor.dtype, tensor.shape)
        ready = self._ready(
            host, what, key, data, False, tensor, apart=True, src=src, dtype=tensor.dtype
        )
        if ready is None:
            return False
        prep, lane = ready
        write = (lambda rows: stack_into(rows, scatter_list)) if root else write_nothing
        got = steady(engine, host, prep, what, self.serializer, data, None, write)
        if got is not None:
            _part_into(tensor, got[src])
        elif lane is not None:
            _lanes.scatter_by(engine, lane, tensor, scatter_list, src)
        return True

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor) -> bool:
        """A steady checked ``all_to_all_single`` of ``input`` into ``output``, even splits.

        Where another rank passed explicit splits the headers differ, and this
        rank compares the sizes pair by pair with it, as the communicator's
        method does (:meth:`~commlib._guard.Guard.pairs_after`): the same
        error on every rank, or the call with explicit splits on every rank.

        Examples:
            >>> comm._lanes.riding.all_to_all_single(out, torch.ones(2))  # doctest: +SKIP
            True
        """
        engine = self.engine
        host = self._both(output, input)
        # this rank's own pair too (rows sent itself, expected; the key names both shapes)
        if host is None or output.shape != input.shape:
            return False
        what = "all_to_all_single"
        key = (input.dtype, input.shape, output.shape)
        views = self.guard.views.get(key)  # (made by the key's first call)
        if views is None:
            return False
        data = self._riding(what, views[0].of(input))
        ready = self._ready(host, what, key, data, True, input, apart=True, dtype=input.dtype)
        if ready is None:
            return False
        prep, lane = ready
        into = None if data is None else views[1].of(output)
        try:
            parts = steady(engine, host, prep, what, self.serializer, data, None, None, into)
        except RemoteArgumentError as exc:  # another rank passed explicit splits?
            rows = [input.shape[0] // engine.world_size] * engine.world_size
            self.guard.pairs_after(exc, engine, input, rows, rows, None)
            engine.all_to_all_single(output, input, rows, rows, value=[output])
            return True
        if parts is None and lane is not None:
            engine.direct(what, lane, output, input, [], [])
        return True

    def all_to_all(self, outputs: Any, inputs: Any) -> bool:
        """A steady checked ``all_to_all`` of lists of one shape (plain tensors), if it serves.

        Examples:
            >>> comm._lanes.riding.all_to_all(outs, ins)  # doctest: +SKIP
            True
        """
        engine = self.engine
        host: HostSlots | None = engine.kept.get("check")
        if host is None or _steps.unfinished:
            return False
        # what the communicator's validation checks every call: the lists (the key
        # names their one dtype and shape)
        plain = check.plain_tensor_lists(outputs, inputs, engine.world_size)
        if plain is None or not plain[1]:
            return False
        what = "all_to_all"
        first = inputs[0]
        dtype = first.dtype
        # this rank's part for rank j rides in the row for j (the rows only declared)
        rows = self.guard.rows(dtype, first.shape, engine.world_size)
        data = self._riding(what, rows)
        key = (dtype, first.shape)
        ready = self._ready(host, what, key, data, False, first, apart=True, dtype=dtype)
        if ready is None:
            return False
        prep, lane = ready
        outs, ins = list(outputs), list(inputs)
        try:
            parts = steady(
                engine, host, prep, what, self.serializer, data, None, lambda a: stack_into(a, ins)
            )
        except RemoteArgumentError as exc:  # another rank's lists of other shapes?
            self.guard.lists_after(exc, engine, dtype, outs, ins, None)
            if not _lanes.Lanes.all_to_all(engine, outs, ins, dtype):
                engine.all_to_all(outs, ins, value=outs)
            return True
        if parts is not None:
            if first.numel() * engine.world_size < PARALLEL_FROM:
                torch._foreach_copy_(outs, parts)  # small, one shape: one op
            else:
                for out, part in zip(outs, parts):
                    host_copy(out, part)
        elif lane is not None:
            engine.direct(what, lane, outs, ins)
        return True


def _part_into(tensor: torch.Tensor, part: torch.Tensor) -> None:
    """A round's ``part`` (plain memory of ``tensor``'s bytes) into ``tensor``.

    As plain memory where ``tensor`` is plain too (no dispatcher: cold after a
    sleep, see :mod:`commlib._host_copy`); through torch's copy where it
    conjugates or negates lazily.

    Examples:
        >>> z = torch.zeros(2, dtype=torch.complex64)
        >>> _part_into(z.conj(), torch.tensor([1j, 2j], dtype=torch.complex64))
        >>> z.tolist()
        [-1j, -2j]
    """
    if is_plain_memory(tensor):
        copy_bytes(tensor.data_ptr(), (part,), tensor.nbytes)
    else:
        host_copy(tensor, part)
