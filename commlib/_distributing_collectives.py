"""The collectives that hand data out: ``broadcast``, ``scatter``, ``all_to_all``(``_single``).

Methods of :class:`~commlib.Communicator`, which derives from
:class:`DistributingCollectives`: each is the public method itself (no frame
of its own in between). ``broadcast`` and ``scatter`` send from one root,
``all_to_all`` and ``all_to_all_single`` between every pair of ranks; where
they are checked, small data rides in the check's round.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, overload

import torch

from commlib import _nested
from commlib import _validation as check
from commlib._collective import collective
from commlib._engine import Engine
from commlib._guard import Guard, finished, write_nothing
from commlib._host_copy import PARALLEL_FROM, host_copy, stack_into
from commlib._lanes import Lanes, learn_once
from commlib._settings import as_timedelta
from commlib.errors import RemoteArgumentError
from commlib.handle import Handle
from commlib.reductions import copy_back, write_back
from commlib.types import Timeout

_Data = TypeVar("_Data")


class DistributingCollectives:
    """``broadcast``, ``scatter`` and the all-to-alls of a :class:`~commlib.Communicator`."""

    # what the Communicator holds (its __init__ sets them)
    _lanes: Lanes
    _guard: Guard
    _member: Callable[[str], Engine]

    @overload
    def broadcast(
        self,
        tensor: torch.Tensor,
        src: int = ...,
        *,
        async_op: bool = ...,
        timeout: Timeout = ...,
    ) -> Handle | None: ...
    @overload
    def broadcast(
        self, tensor: _Data, src: int = ..., *, async_op: bool = ..., timeout: Timeout = ...
    ) -> _Data: ...
    @collective("broadcast")
    def broadcast(
        self,
        tensor: Any,
        src: int = 0,
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Any:
        """Copy ``src``'s ``tensor`` into ``tensor`` on every rank, in place.

        ``tensor`` may also be a Python value (any picklable object), returned
        as ``src`` holds it (ignite's ``idist.broadcast``), or a nested
        structure: its tensors (same structure, dtypes and shapes on every
        rank, or the same :class:`~commlib.errors.RemoteArgumentError`
        everywhere naming the path) are written in place, and the structure
        is returned with ``src``'s other values; a rank that passes ``None``
        (no tensor) gets ``src``'s value, new tensors included. A plain tensor
        must be passed on every rank (a rank passing ``None`` makes every
        rank raise the same ``RemoteArgumentError`` saying what to use).
        ``async_op`` takes a tensor only.

        Examples:
            >>> x = torch.tensor([comm.rank])
            >>> comm.broadcast(x, src=0)
            >>> x
            tensor([0])
        """
        if self._lanes.broadcast(tensor, src, async_op, timeout):
            return None
        engine = self._member("broadcast")
        if not isinstance(tensor, torch.Tensor):
            return _nested.broadcast(self, tensor, src, timeout, async_op=async_op)
        check.tensor(tensor, "tensor")
        check.rank_in_range(src, engine.world_size, "src")
        work_t = engine.to_device(tensor)
        world = engine.world_size
        guard = self._guard
        if "broadcast" in guard.checked:
            try:
                parts = guard.check(
                    engine,
                    "broadcast",
                    lambda: f"src={src}, {tensor.dtype}, {tuple(tensor.shape)}",
                    work_t,
                    timeout,
                    # only src's data is read: the others send their slot's header alone
                    write=None if engine.rank == src else write_nothing,
                    key=(src, tensor.dtype, tensor.shape),
                )
            except RemoteArgumentError as exc:  # a rank passed None: say so, as it does
                raise _nested.tensor_meets_no_tensor(exc, src) from None
            if parts is not None:
                if engine.rank != src:
                    host_copy(work_t, parts[src])
                return write_back(copy_back, work_t, tensor, world, async_op)
        else:  # (a checked call takes no lane: none learnt)
            learn_once(engine, "broadcast", src=src, dtype=tensor.dtype)
        return engine.broadcast(
            work_t,
            src,
            finish=None if work_t is tensor else lambda: copy_back(work_t, tensor, world),
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[tensor],
        )

    @collective("scatter")
    def scatter(
        self,
        tensor: torch.Tensor,
        scatter_list: Sequence[torch.Tensor] | None = None,
        src: int = 0,
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Fill ``tensor`` on each rank ``i`` with ``scatter_list[i]`` of ``src``, in place.

        ``src`` passes ``world_size`` tensors shaped like ``tensor``; the
        other ranks' ``scatter_list`` is ignored (``None`` is usual there).
        Where the arguments are checked (:attr:`checks`), a wrong list on
        ``src`` fails every rank at once, in the check's round; unchecked,
        ``src`` raises before anything is sent, and the others wait for it
        until their timeout.

        Examples:
            >>> out = torch.empty(2)
            >>> parts = [torch.full((2,), float(i)) for i in range(comm.world_size)]
            >>> comm.scatter(out, parts if comm.rank == 0 else None, src=0)
            >>> out
            tensor([0., 0.])
        """
        if self._lanes.scatter(tensor, scatter_list, src, async_op, timeout):
            return None
        engine = self._member("scatter")
        check.tensor(tensor, "tensor")
        world = engine.world_size
        check.rank_in_range(src, world, "src")
        parts = None
        if engine.rank == src:  # the others wait for src: a mistake here reaches them
            check.tensor_list(scatter_list, world, "scatter_list", like=tensor, on="src")
            parts = [engine.to_device(t) for t in scatter_list or ()]
        work_t = engine.to_device(tensor)

        def describe() -> str:
            return f"src={src}, {tensor.dtype}, {tuple(tensor.shape)}"

        guard = self._guard
        if "scatter" in guard.checked and "scatter" in guard.completed_by_check:
            # src's piece for each rank travels in the row of the check's round
            # that goes to that rank when it fits (every rank declares its size
            # alike): one round, not two
            sent = parts
            got = guard.check(
                engine,
                "scatter",
                describe,
                guard.rows(tensor.dtype, tensor.shape, world),  # (src's pieces: the writer's)
                timeout,
                write=write_nothing if sent is None else lambda rows: stack_into(rows, sent),
                apart=True,
                key=(src, tensor.dtype, tensor.shape),
            )
            if got is not None:
                host_copy(work_t, got[src])
                return write_back(copy_back, work_t, tensor, world, async_op)
        elif "scatter" in guard.checked:
            guard.check(
                engine, "scatter", describe, timeout=timeout, key=(src, tensor.dtype, tensor.shape)
            )
        else:  # (a checked call takes no lane: none learnt)
            learn_once(engine, "scatter", src=src, dtype=tensor.dtype)
        return engine.scatter(
            work_t,
            parts,
            src,
            finish=None if work_t is tensor else lambda: copy_back(work_t, tensor, world),
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[tensor],
        )

    @collective("all_to_all")
    def all_to_all(
        self,
        output_tensor_list: Sequence[torch.Tensor],
        input_tensor_list: Sequence[torch.Tensor],
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Send ``input_tensor_list[i]`` to rank ``i``, receive into ``output_tensor_list[i]``.

        Both lists hold ``world_size`` tensors of one dtype; the shapes may
        differ, but what rank ``j`` sends here must be shaped like
        ``output_tensor_list[j]``.

        Examples:
            >>> outs = [torch.empty(2) for _ in range(comm.world_size)]
            >>> ins = [torch.full((2,), float(comm.rank)) for _ in range(comm.world_size)]
            >>> comm.all_to_all(outs, ins)
            >>> outs              # outs[j] is rank j's
            [tensor([0., 0.])]
        """
        lanes = self._lanes
        if lanes.all_to_all_checked(output_tensor_list, input_tensor_list, async_op, timeout):
            return None
        engine = self._member("all_to_all")
        world = engine.world_size
        # one loop over both lists where the engine takes every tensor as it is
        plain = check.plain_tensor_lists(
            output_tensor_list,
            input_tensor_list,
            world,
            None if engine.on_cpu else engine.device_obj,
        )
        if plain is None:
            check.tensor_list(output_tensor_list, world, "output_tensor_list")
            check.tensor_list(input_tensor_list, world, "input_tensor_list")
            dtype = check.same_dtype([*output_tensor_list, *input_tensor_list], "all_to_all")
        else:
            dtype = plain[0]
        guard = self._guard
        if "all_to_all" in guard.checked:
            # lists of one shape: small parts ride in the check's round, each in the row
            # that goes to its rank (one round); other lists' sizes are checked pair by pair
            parts = guard.check_all_to_all(
                engine,
                dtype,
                output_tensor_list,
                input_tensor_list,
                plain is not None and plain[1],
                timeout,
            )
            if parts is not None:
                outs = list(output_tensor_list)
                if plain is not None and plain[1] and outs[0].numel() * world < PARALLEL_FROM:
                    torch._foreach_copy_(outs, parts)  # small, one shape: one op
                else:
                    for out_t, part in zip(outs, parts):
                        host_copy(out_t, part)
                if not async_op:
                    return None
                return finished(lambda: None, async_op, list(output_tensor_list))
        if plain is not None:  # the engine writes the caller's own tensors: nothing to finish
            outs = list(output_tensor_list)
            ins = list(input_tensor_list)
            if plain[1] and not async_op and timeout is None:
                # one shape: the engine's own all_to_all where the plugin has it
                if Lanes.all_to_all(engine, outs, ins, dtype):
                    return None
            return engine.all_to_all(
                outs,
                ins,
                timeout=None if timeout is None else as_timedelta(timeout),
                async_op=async_op,
                value=list(output_tensor_list),
            )
        to_device = engine.to_device
        outs = [to_device(t) for t in output_tensor_list]
        ins = [to_device(t) for t in input_tensor_list]

        def finish() -> None:
            for out_t, target in zip(outs, output_tensor_list):
                copy_back(out_t, target, world)

        # nothing to finish when the engine writes the caller's own tensors
        written = all(map(operator.is_, outs, output_tensor_list))
        return engine.all_to_all(
            outs,
            ins,
            finish=None if written else finish,
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=list(output_tensor_list),
        )

    @collective("all_to_all_single")
    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Scatter ``input``'s rows to every rank and gather theirs into ``output``.

        ``input_split_sizes[i]`` rows of ``input`` (along dim 0, in order) go
        to rank ``i``; ``output_split_sizes[i]`` rows of ``output`` come from
        rank ``i``. ``None`` splits evenly. Splits may be uneven and zero, but
        what rank ``i`` sends here must be what this rank expects from it.

        Examples:
            >>> out = torch.empty(comm.world_size)
            >>> comm.all_to_all_single(out, torch.arange(float(comm.world_size)))
            >>> out               # rank r gets element r of every rank
            tensor([0.])
            >>> # uneven: rank r sends i + 1 rows to rank i, and gets r + 1 rows from each
        """
        if self._lanes.all_to_all_single(
            output, input, output_split_sizes, input_split_sizes, async_op, timeout
        ):
            return None
        engine = self._member("all_to_all_single")
        world = engine.world_size
        check.tensor(output, "output")
        check.tensor(input, "input")
        check.same_dtype([output, input], "all_to_all_single")
        if output.dim() == 0 or input.dim() == 0 or output.shape[1:] != input.shape[1:]:
            raise ValueError(
                "all_to_all_single needs output and input of at least one dim whose rows "
                f"(dims after the first) match, got {tuple(output.shape)} and "
                f"{tuple(input.shape)}"
            )
        out_splits = check.split_sizes(output_split_sizes, world, output.shape[0], "output")
        in_splits = check.split_sizes(input_split_sizes, world, input.shape[0], "input")
        me = engine.rank
        in_t, out_t = engine.to_device(input), engine.to_device(output)
        rows_out = in_splits or [input.shape[0] // world] * world
        rows_in = out_splits or [output.shape[0] // world] * world
        even = in_splits is None and out_splits is None
        checked = self._guard.check_all_to_all_single(
            engine, in_t, out_t, rows_out, rows_in, even, timeout
        )
        if checked == "rode":
            return write_back(copy_back, out_t, output, world, async_op)
        if "all_to_all_single" not in self._guard.checked:  # (a checked call takes no lane)
            learn_once(engine, "all_to_all_single", dtype=input.dtype)
        if checked == "explicit":  # ranks passed None and explicit splits: the same call on all
            in_splits, out_splits = rows_out, rows_in
        check.self_pair(rows_out[me], rows_in[me], me)  # checked, the guard raised it
        return engine.all_to_all_single(
            out_t,
            in_t,
            out_splits,
            in_splits,
            finish=None if out_t is output else lambda: copy_back(out_t, output, world),
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[output],
        )
