"""The mpi plugin's direct calls: each collective's nonblocking MPI call, issued by the engine.

What :meth:`commlib_backends.mpi.MPICalls.direct_call` hands the engine
(:class:`~commlib.backend.DirectCall`): for one collective and key (op,
dtype, root), the one mpi4py call the plugin's method would make, with its
datatype, op and root looked up once. The engine issues it past the method
for a blocking, unchecked call with the communicator's timeout
(:meth:`commlib._engine.Engine.direct`) and waits on the returned
:class:`~commlib_backends.mpi_group.MPIWork` in slices, as for every call:
MPI has no timed wait, so a lane issues the nonblocking call (``Iallreduce``,
``Ibcast``, ...) like the methods do, never the blocking one.

Each lane issues exactly the MPI call the method issues for the same
arguments: MPI pairs the ranks' calls by kind, and ranks may take different
ways to the same collective (a rank with an unfinished async protocol, or
one that has not learnt the key yet, takes the method), so a lane that
issued another algorithm (point to point in place of ``Iscatter``) could
meet the method's call on another rank and hang.

Each call takes the engine's arguments for its collective (``[tensor]``,
``output, input``, ...) and the lane's options last (none here: what varies
is bound in the call); the buffers are the tensors' own memory
(``MPI.buffer.fromaddress``), as in the methods.

Examples:
    >>> lane = plugin.direct_call("broadcast", group, src=0, dtype=torch.float32)
    ... # doctest: +SKIP
    >>> lane.call([torch.ones(4)], lane.options).wait()   # what the engine does  # doctest: +SKIP
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from commlib_backends.mpi_group import MPIWork, yield_core

Issue = Callable[..., "MPIWork | None"]

#: Tests of a fresh request before its work object is made: a small collective
#: between ranks on one machine ends within them (a few microseconds), and the work,
#: its wait and its poll loop are then never made; a later one is waited on by the
#: engine as before (its slices). First back to back (~0.2 us a test: ranks in step),
#: then with the core yielded between tests (a peer that is late is often one waiting
#: for a core: see mpi_group._YIELD_BELOW; ~1 us a test when nothing else runs).
SPINS = range(16)
YIELDS = range(32)


def settled(request: Any, keep: Any) -> MPIWork | None:
    """``None`` if ``request`` completes within a few tests; otherwise its work to wait on.

    Examples:
        >>> settled(mpi().COMM_SELF.Ibarrier(), None) is None  # doctest: +SKIP
        True
    """
    test = request.Test
    for _ in SPINS:
        if test():
            return None
    for _ in YIELDS:
        yield_core()
        if test():
            return None
    return MPIWork([request], keep=keep)


def run_of(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The one flat byte tensor ``tensors`` lie in back to back, if they do (no copy).

    Examples:
        >>> whole = torch.arange(6.0)
        >>> run_of(list(whole.view(2, 3).unbind(0))).numel()   # 6 floats, as bytes
        24
        >>> run_of([torch.ones(2), torch.ones(2)]) is None
        True
    """
    if not tensors:
        return None
    first = tensors[0]
    size = first.numel() * first.element_size()
    start = first.data_ptr()
    for i, t in enumerate(tensors):
        if t.numel() * t.element_size() != size or t.data_ptr() != start + i * size:
            return None
        if not t.is_contiguous():
            return None
    base = first.untyped_storage()
    offset = start - base.data_ptr()
    flat = torch.empty(0, dtype=torch.uint8).set_(base, offset, (size * len(tensors),), (1,))
    return flat


def as_bytes(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's memory as a flat uint8 tensor (0-dim ones as one element).

    Examples:
        >>> [t.numel() for t in as_bytes([torch.ones(2), torch.tensor(1.0)])]
        [8, 4]
    """
    return [
        t.reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)
        for t in (x if x.dim() else x.reshape(1) for x in tensors)
    ]


def lane_call(
    collective: str, comm: Any, names: Any, key: dict[str, Any], rank: int
) -> Issue | None:
    """The engine's call for ``collective`` and ``key`` on ``comm``; ``None``: no lane.

    ``names`` holds MPI's datatypes, ops and buffer maker
    (:class:`commlib_backends.mpi._Names`); ``rank`` is this rank in
    ``comm``. The caller has checked that the plugin reduces ``key``'s op
    and dtype natively, where there is one.

    Examples:
        >>> call = lane_call("barrier", comm, names, {}, 0)      # doctest: +SKIP
        >>> call(None).wait()                                     # doctest: +SKIP
        True
    """
    address, byte = names.address, names.byte
    dtype = key.get("dtype")
    if collective in ("all_reduce", "reduce", "reduce_scatter"):
        mpi_type = names.types.get(dtype)
        if mpi_type is None or dtype is None or dtype.is_complex:
            return None  # (the method reduces complex sums as real pairs)
        mpi_op = names.ops[key["op"]]
        if collective == "all_reduce":
            return _all_reduce(comm.Iallreduce, names.in_place, address, mpi_type, mpi_op)
        if collective == "reduce":
            root = key["dst"]
            return _reduce(comm.Ireduce, names.in_place, address, mpi_type, mpi_op, root, rank)
        return _reduce_scatter(comm.Ireduce_scatter_block, address, mpi_type, mpi_op)
    if collective == "broadcast":
        return _broadcast(comm.Ibcast, address, byte, key["src"])
    if collective == "all_gather_into_tensor":
        return _all_gather_into_tensor(comm.Iallgather, names.in_place, address, byte, rank)
    if collective == "all_to_all_single":
        return _all_to_all_single(comm.Ialltoall, address, byte)
    if collective == "scatter":
        return _scatter(comm.Iscatter, address, byte, key["src"], rank)
    if collective == "barrier":
        ibarrier = comm.Ibarrier
        return lambda options: MPIWork([ibarrier()])
    if collective in ("send", "recv"):
        return _point_to_point(comm.Isend if collective == "send" else comm.Irecv, address, byte)
    return None


def _all_reduce(iallreduce: Any, in_place: Any, address: Any, mpi_type: Any, op: Any) -> Issue:
    def call(tensors: list[torch.Tensor], options: Any) -> MPIWork | None:
        t = tensors[0]
        request = iallreduce(in_place, [address(t.data_ptr(), t.nbytes), mpi_type], op)
        return settled(request, t)

    return call


def _reduce(
    ireduce: Any, in_place: Any, address: Any, mpi_type: Any, op: Any, root: int, rank: int
) -> Issue:
    if rank == root:

        def at_root(tensors: list[torch.Tensor], options: Any) -> MPIWork | None:
            t = tensors[0]
            request = ireduce(in_place, [address(t.data_ptr(), t.nbytes), mpi_type], op, root)
            return settled(request, t)

        return at_root

    def elsewhere(tensors: list[torch.Tensor], options: Any) -> MPIWork | None:
        t = tensors[0]
        request = ireduce([address(t.data_ptr(), t.nbytes), mpi_type], None, op, root)
        return settled(request, t)

    return elsewhere


def _reduce_scatter(ireduce_scatter: Any, address: Any, mpi_type: Any, op: Any) -> Issue:
    def call(output: torch.Tensor, input: torch.Tensor, options: Any) -> MPIWork | None:
        request = ireduce_scatter(
            [address(input.data_ptr(), input.nbytes), mpi_type],
            [address(output.data_ptr(), output.nbytes), mpi_type],
            op,
        )
        return settled(request, (output, input))

    return call


def _broadcast(ibcast: Any, address: Any, byte: Any, root: int) -> Issue:
    def call(tensors: list[torch.Tensor], options: Any) -> MPIWork | None:
        t = tensors[0]
        return settled(ibcast([address(t.data_ptr(), t.nbytes), byte], root), t)

    return call


def _all_gather_into_tensor(
    iallgather: Any, in_place: Any, address: Any, byte: Any, rank: int
) -> Issue:
    def call(output: torch.Tensor, tensor: torch.Tensor, options: Any) -> MPIWork | None:
        start, total = output.data_ptr(), output.nbytes
        mine, nbytes = tensor.data_ptr(), tensor.nbytes
        into = [address(start, total), byte]
        if start <= mine < start + total:
            # MPI refuses aliased buffers; FSDP gathers from the output's own slot
            if mine == start + rank * nbytes:
                return settled(iallgather(in_place, into), output)
            tensor = tensor.clone()
            mine = tensor.data_ptr()
        request = iallgather([address(mine, nbytes), byte], into)
        return settled(request, (output, tensor))

    return call


def _all_to_all_single(ialltoall: Any, address: Any, byte: Any) -> Issue:
    def call(
        output: torch.Tensor, input: torch.Tensor, out_splits: Any, in_splits: Any, options: Any
    ) -> MPIWork | None:
        request = ialltoall(
            [address(input.data_ptr(), input.nbytes), byte],
            [address(output.data_ptr(), output.nbytes), byte],
        )
        return settled(request, (output, input))

    return call


def _scatter(iscatter: Any, address: Any, byte: Any, root: int, rank: int) -> Issue:
    if rank == root:

        def at_root(
            tensors: list[torch.Tensor], lists: list[list[torch.Tensor]], options: Any
        ) -> MPIWork | None:
            t = tensors[0]
            parts = lists[0]
            whole = run_of(parts)
            if whole is None:
                whole = torch.cat(as_bytes(parts))
            request = iscatter(
                [address(whole.data_ptr(), whole.nbytes), byte],
                [address(t.data_ptr(), t.nbytes), byte],
                root,
            )
            return settled(request, (whole, t))

        return at_root

    def elsewhere(tensors: list[torch.Tensor], lists: Any, options: Any) -> MPIWork | None:
        t = tensors[0]
        return settled(iscatter(None, [address(t.data_ptr(), t.nbytes), byte], root), t)

    return elsewhere


def _point_to_point(post: Any, address: Any, byte: Any) -> Issue:
    def call(tensors: list[torch.Tensor], peer: int, tag: int) -> MPIWork | None:
        t = tensors[0]
        return settled(post([address(t.data_ptr(), t.nbytes), byte], peer, tag), t)

    return call
