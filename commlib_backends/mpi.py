"""``mpi``: CPU collectives through MPI (mpi4py), ranks started by ``mpiexec``.

``pip install 'commlib[mpi]'`` brings mpi4py and MPICH; a system MPI works
too. Ranks start with ``mpiexec -n N python script.py`` and the script calls
``commlib.init_dist("mpi")`` (or ``init_dist(..., backend="mpi")``): rank and
world size come from MPI, and the torch.distributed store the rest of commlib
uses is hosted by rank 0 on a port the OS picks, announced through MPI.

The group is a real ``torch.distributed.ProcessGroup``
(:class:`~commlib_backends.mpi_group.MPIProcessGroup`, torch backend
``mpi4py``), so ``torch.distributed`` calls and DDP run on it too; this
plugin calls mpi4py on the group's communicator itself, without torch's
dispatch. Tensors travel in place: MPI reads and writes their memory
(``MPI.buffer.fromaddress``), no copies except where a list of separate
tensors has to become one buffer.

Facts (MPICH 5.0.2, mpi4py 4.1.2, torch 2.13) and what follows from them:

* MPI moves any bytes: every dtype travels; MPI reduces the integer types,
  float16/32/64 and (sums of) complex; bool and bfloat16 reductions are
  gathered and reduced here, in rank order (``EngineGaps``);
* MPI has no timed wait: a wait polls the request until its deadline and
  then gives up, leaving the request pending (``interruptible_wait``); a
  collective cannot be cancelled, so a group whose call timed out stays
  broken, its pending buffers kept alive for MPI to finish with;
* a size mismatch between ranks is not an error MPI reports, even with
  ``MPI.ERRORS_RETURN`` (mpi4py's default, set on every group): a broadcast
  fails on the receiving ranks only, an all_reduce or all_gather of
  different lengths completes with no error, and at 4 MiB against 2 MiB
  corrupts the heap (measured in docs/backends.md): ``mismatch_aborts``
  stays ``True``, so commlib checks the arguments;
* the object collectives' large payloads go point to point
  (``large_payload_transport``): 8-15x faster than padded collectives at
  64 MiB (measured in docs/benchmarks.md);
* hydra (MPICH's mpiexec) ends every rank when one dies: there is no
  survivor to shrink with; ``shrink`` on ranks that are all alive builds the
  survivors' communicator with ``MPI_Comm_create_group``, among them alone.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from commlib.backend import DirectCall
from commlib.hookspecs import hookimpl
from commlib.types import EngineOp, Group, P2PRequest, Work
from commlib_backends import mpi_group
from commlib_backends.engine_gaps import EngineGaps
from commlib_backends.mpi_group import MPIWork, finish, mpi, yield_core
from commlib_backends.mpi_lanes import SPINS, YIELDS, lane_call
from commlib_backends.mpi_lanes import as_bytes as _bytes
from commlib_backends.mpi_lanes import run_of as _run_of

_ALL_DTYPES = frozenset(v for v in vars(torch).values() if isinstance(v, torch.dtype))
_NATIVE_REDUCE = {
    torch.uint8: "UINT8_T",
    torch.int8: "INT8_T",
    torch.int16: "INT16_T",
    torch.int32: "INT32_T",
    torch.int64: "INT64_T",
    torch.uint16: "UINT16_T",
    torch.uint32: "UINT32_T",
    torch.uint64: "UINT64_T",
    torch.float16: "FLOAT16",
    torch.float32: "FLOAT",
    torch.float64: "DOUBLE",
    torch.complex64: "C_FLOAT_COMPLEX",
    torch.complex128: "C_DOUBLE_COMPLEX",
}
_OPS = {
    "sum": "SUM",
    "product": "PROD",
    "min": "MIN",
    "max": "MAX",
    "band": "BAND",
    "bor": "BOR",
    "bxor": "BXOR",
}


class _Names:
    """MPI's datatypes and ops for torch's, looked up once MPI is loaded."""

    def __init__(self, MPI: Any):
        self.types: dict[torch.dtype, Any] = {}
        for dtype, name in _NATIVE_REDUCE.items():
            found = getattr(MPI, name, None)
            if name == "FLOAT16" and found is None:
                found = _float16(MPI)
            if found is not None and found != MPI.DATATYPE_NULL:
                self.types[dtype] = found
        self.ops = {k: getattr(MPI, v) for k, v in _OPS.items()}
        self.byte = MPI.BYTE
        self.in_place = MPI.IN_PLACE
        self.address = MPI.buffer.fromaddress


def _float16(MPI: Any) -> Any:
    try:
        return MPI.Datatype.fromcode("e")  # MPICH's MPIX_C_FLOAT16, where it has one
    except (KeyError, ValueError, MPI.Exception):
        return None


class MPICalls(EngineGaps):
    """The Backend contract on mpi4py: each method one MPI call on the group's communicator."""

    _names: ClassVar[_Names | None] = None

    # -- buffers -----------------------------------------------------------------------
    @classmethod
    def _mpi(cls) -> _Names:
        names = cls._names
        if names is None:
            names = MPICalls._names = _Names(mpi())
        return names

    def _raw(self, tensor: torch.Tensor) -> list[Any]:
        """``tensor``'s memory as MPI bytes, in place."""
        n = self._mpi()
        nbytes = tensor.numel() * tensor.element_size()
        if not nbytes:
            return [bytearray(0), n.byte]
        return [n.address(tensor.data_ptr(), nbytes), n.byte]

    def _typed(self, tensor: torch.Tensor) -> list[Any]:
        """``tensor``'s memory with its MPI datatype, for reductions."""
        n = self._mpi()
        if tensor.dtype.is_complex and tensor.dtype not in n.types:
            tensor = torch.view_as_real(tensor)
        nbytes = tensor.numel() * tensor.element_size()
        return [n.address(tensor.data_ptr(), nbytes), n.types[tensor.dtype]]

    @staticmethod
    def comm_of(group: Group) -> Any:
        """The MPI communicator of ``group`` (an ``mpi4py`` process group; None: the world).

        Examples:
            >>> plugin.comm_of(None).Get_size() == commlib.get_world_size()  # doctest: +SKIP
            True
        """
        if group is None:
            group = dist.group.WORLD
        comm = getattr(group, "comm", None)
        if comm is None:
            raise ValueError(
                f"the mpi backend serves process groups of torch backend "
                f"{mpi_group.TORCH_BACKEND!r} only, got {group!r}"
            )
        return comm

    def rank(self, group: Group) -> int:
        if group is dist.GroupMember.NON_GROUP_MEMBER:
            return -1
        return int(self.comm_of(group).Get_rank())

    def world_size(self, group: Group) -> int:
        return int(self.comm_of(group).Get_size())

    def torch_reduce_op(self, op: EngineOp) -> Any:
        return self._mpi().ops[op]

    def direct_call(self, collective: str, group: Group, **key: Any) -> DirectCall | None:
        """Each collective's nonblocking MPI call, issued by the engine past the method.

        The lanes (:mod:`commlib_backends.mpi_lanes`) make the call the
        method makes, with its datatype, op and root looked up once: the
        engine issues it for blocking unchecked calls and waits in slices.
        None where the method does more (a reduction MPI lacks, complex
        sums, a group of one's gathers: copies), nor for 0-byte tensors.

        The check's round (``all_gather_slots``) is one ``Iallgather`` of the
        slot's first row into every rank's rows, past :meth:`all_gather_slots`
        and :meth:`all_gather_into_tensor` (their layers cost more than MPI's
        small allgather itself); the slot's MPI buffers are made once.

        Examples:
            >>> lane = plugin.direct_call("all_gather_slots", group, slot_bytes=4096)
            ... # doctest: +SKIP
            >>> plugin.direct_call("broadcast", group, src=0, dtype=torch.float32).min_bytes
            ... # doctest: +SKIP
            1
        """
        if collective == "all_gather_slots":
            return self._slot_lane(group, key)
        if collective == "all_to_all":
            return self._all_to_all_lane(group)
        op = key.get("op")
        if op is not None and not self.reduces_natively(op, key["dtype"]):
            return None  # the method reduces it here (EngineGaps)
        alone = self.world_size(group) == 1
        if alone:
            # nothing to send for a reduction, a broadcast or a barrier; the others copy
            ident = collective in ("all_reduce", "reduce", "broadcast", "barrier")
            return DirectCall(None, None) if ident else None
        comm = self.comm_of(group)
        call = lane_call(collective, comm, self._mpi(), key, comm.Get_rank())
        # (a 0-byte tensor takes the method, which hands MPI an empty buffer)
        return None if call is None else DirectCall(call, None, min_bytes=1)

    def _slot_lane(self, group: Group, key: dict[str, Any]) -> DirectCall | None:
        if key.get("apart", False):
            return None  # rows sent apart: the method's all_to_all
        if type(self).all_gather_slots is not EngineGaps.all_gather_slots or (
            type(self).all_gather_into_tensor is not MPICalls.all_gather_into_tensor
        ):
            return None  # a subclass gathers its own way: its method is called
        if self.world_size(group) == 1:
            return DirectCall(None, None)
        return DirectCall(_SlotGather(self.comm_of(group), self._mpi()), None)

    def _all_to_all_lane(self, group: Group) -> DirectCall | None:
        if self.world_size(group) == 1:
            return None
        plugin = self

        def call(outs: list[torch.Tensor], ins: list[torch.Tensor], options: Any) -> Work:
            # this class's packing (the lane vouches for it), without the engine's frame
            work = MPICalls.all_to_all(plugin, outs, ins, group, True)
            assert work is not None  # (async_op: the request's work)
            return work

        return DirectCall(call, None)

    # -- collectives -------------------------------------------------------------------
    def all_reduce(
        self, tensor: torch.Tensor, op: EngineOp, group: Group, async_op: bool = False
    ) -> Work | None:
        if not self.reduces_natively(op, tensor.dtype):
            return super().all_reduce(tensor, op, group, async_op)
        n = self._mpi()
        request = self.comm_of(group).Iallreduce(n.in_place, self._typed(tensor), n.ops[op])
        return finish(MPIWork([request], keep=tensor), async_op)

    def broadcast(
        self, tensor: torch.Tensor, src: int, group: Group, async_op: bool = False
    ) -> Work | None:
        request = self.comm_of(group).Ibcast(self._raw(tensor), src)
        return finish(MPIWork([request], keep=tensor), async_op)

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, group: Group, async_op: bool = False
    ) -> Work | None:
        comm = self.comm_of(group)
        start, nbytes = output.data_ptr(), tensor.numel() * tensor.element_size()
        if start <= tensor.data_ptr() < start + output.numel() * output.element_size():
            # MPI refuses aliased buffers; FSDP gathers from the output's own slot
            if tensor.data_ptr() == start + comm.Get_rank() * nbytes and tensor.is_contiguous():
                request = comm.Iallgather(self._mpi().in_place, self._raw(output))
                return finish(MPIWork([request], keep=output), async_op)
            tensor = tensor.clone()
        request = comm.Iallgather(self._raw(tensor), self._raw(output))
        return finish(MPIWork([request], keep=(output, tensor)), async_op)

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        run = _run_of(tensor_list)
        into = (
            run
            if run is not None
            else torch.empty(
                len(tensor_list) * tensor.numel() * tensor.element_size(), dtype=torch.uint8
            )
        )
        request = self.comm_of(group).Iallgather(self._raw(tensor), self._raw(into))
        then = None if run is not None else _copy_out(into, tensor_list)
        return finish(MPIWork([request], then, keep=(into, tensor)), async_op)

    def gather(
        self,
        tensor: torch.Tensor,
        gather_list: list[torch.Tensor] | None,
        dst: int,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        comm = self.comm_of(group)
        if comm.Get_rank() != dst:
            request = comm.Igather(self._raw(tensor), None, dst)
            return finish(MPIWork([request], keep=tensor), async_op)
        parts = gather_list or [torch.empty_like(tensor) for _ in range(comm.Get_size())]
        run = _run_of(parts)
        into = (
            run
            if run is not None
            else torch.empty(
                len(parts) * tensor.numel() * tensor.element_size(), dtype=torch.uint8
            )
        )
        request = comm.Igather(self._raw(tensor), self._raw(into), dst)
        then = None if run is not None else _copy_out(into, parts)
        return finish(MPIWork([request], then, keep=(into, tensor)), async_op)

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: EngineOp,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        if not self.reduces_natively(op, input.dtype):
            return super().reduce_scatter(output, input, op, group, async_op)
        n = self._mpi()
        request = self.comm_of(group).Ireduce_scatter_block(
            self._typed(input), self._typed(output), n.ops[op]
        )
        return finish(MPIWork([request], keep=(output, input)), async_op)

    def reduce(
        self, tensor: torch.Tensor, dst: int, op: EngineOp, group: Group, async_op: bool = False
    ) -> Work | None:
        if not self.reduces_natively(op, tensor.dtype):
            return super().reduce(tensor, dst, op, group, async_op)
        n = self._mpi()
        comm = self.comm_of(group)
        if comm.Get_rank() == dst:
            request = comm.Ireduce(n.in_place, self._typed(tensor), n.ops[op], dst)
        else:
            request = comm.Ireduce(self._typed(tensor), None, n.ops[op], dst)
        return finish(MPIWork([request], keep=tensor), async_op)

    def scatter(
        self,
        tensor: torch.Tensor,
        scatter_list: list[torch.Tensor] | None,
        src: int,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        comm = self.comm_of(group)
        whole = None
        if comm.Get_rank() == src and scatter_list:
            whole = _run_of(scatter_list)
            if whole is None:
                whole = torch.cat([t.reshape(-1).view(torch.uint8) for t in _bytes(scatter_list)])
        send = self._raw(whole) if whole is not None else None
        request = comm.Iscatter(send, self._raw(tensor), src)
        return finish(MPIWork([request], keep=(whole, tensor)), async_op)

    def all_to_all(
        self,
        output_list: list[torch.Tensor],
        input_list: list[torch.Tensor],
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        send = _run_of(input_list)
        if send is None:
            send = (
                torch.cat(_bytes(input_list)) if input_list else torch.empty(0, dtype=torch.uint8)
            )
        run = _run_of(output_list)
        out_sizes = [t.numel() * t.element_size() for t in output_list]
        into = run if run is not None else torch.empty(sum(out_sizes), dtype=torch.uint8)
        in_sizes = [t.numel() * t.element_size() for t in input_list]
        request = self.comm_of(group).Ialltoallv(
            self._counted(send, in_sizes), self._counted(into, out_sizes)
        )
        then = None if run is not None else _copy_out(into, output_list, out_sizes)
        # (every rank calls Ialltoallv, whatever its sizes: MPI needs the same call on all)
        return finish(MPIWork([request], then, keep=(send, into), busy=True), async_op)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int] | None,
        input_split_sizes: list[int] | None,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        comm = self.comm_of(group)
        world = comm.Get_size()
        out_sizes = _split_bytes(output, output_split_sizes, world)
        in_sizes = _split_bytes(input, input_split_sizes, world)
        even = output_split_sizes is None and input_split_sizes is None
        if even:
            request = comm.Ialltoall(self._raw(input), self._raw(output))
        else:
            request = comm.Ialltoallv(
                self._counted(input, in_sizes), self._counted(output, out_sizes)
            )
        return finish(MPIWork([request], keep=(output, input), busy=not even), async_op)

    def _counted(self, tensor: torch.Tensor, sizes: list[int]) -> list[Any]:
        raw = self._raw(tensor)
        displs = [0]
        for size in sizes[:-1]:
            displs.append(displs[-1] + size)
        return [raw[0], (sizes, displs), raw[1]]

    def barrier(self, group: Group, timeout: datetime.timedelta | None = None) -> None:
        work = MPIWork([self.comm_of(group).Ibarrier()])
        limit = timeout or getattr(group or dist.group.WORLD, "timeout", None)
        work.wait(limit)

    # -- point to point ----------------------------------------------------------------
    def send(
        self, tensor: torch.Tensor, dst: int, group: Group, async_op: bool = False, tag: int = 0
    ) -> Work | None:
        request = self.comm_of(group).Isend(self._raw(tensor), dst, tag)
        return finish(MPIWork([request], keep=tensor), async_op)

    def recv(
        self, tensor: torch.Tensor, src: int, group: Group, async_op: bool = False, tag: int = 0
    ) -> Work | None:
        request = self.comm_of(group).Irecv(self._raw(tensor), src, tag)
        return finish(MPIWork([request], keep=tensor), async_op)

    def batch_isend_irecv(
        self, requests: Sequence[P2PRequest], group: Group, async_op: bool = False
    ) -> Work | None:
        comm = self.comm_of(group)
        posted = [
            (comm.Isend if r.kind == "send" else comm.Irecv)(self._raw(r.tensor), r.peer, r.tag)
            for r in requests
        ]
        return finish(MPIWork(posted, keep=[r.tensor for r in requests]), async_op)


class _SlotGather:
    """``Iallgather`` of one slot row into every rank's rows, as a direct call.

    Called as ``gather(output, row, options)`` (:class:`~commlib.backend.DirectCall`);
    the buffers MPI gets for the protocol's kept tensors are made once each.
    The last pair of tensors is recognised by identity (it holds them, so
    their ids cannot be reused): a steady round reads no tensor attribute.
    """

    __slots__ = ("buffers", "comm", "last", "names")

    def __init__(self, comm: Any, names: _Names):
        self.comm = comm
        self.names = names
        self.buffers: dict[tuple[int, int], Any] = {}
        # (output, row, output's buffer, row's buffer) of the last call
        self.last: tuple[Any, ...] = (None, None, None, None)

    def _buffer(self, tensor: torch.Tensor) -> Any:
        key = (tensor.data_ptr(), tensor.numel())
        found = self.buffers.get(key)
        if found is None:
            if len(self.buffers) >= 16:
                self.buffers.clear()  # slots of other sizes: a few at most
            found = self.buffers[key] = [self.names.address(key[0], key[1]), self.names.byte]
        return found

    def __call__(self, output: torch.Tensor, row: torch.Tensor, options: Any) -> MPIWork | None:
        last = self.last
        if output is last[0] and row is last[1]:
            into, mine = last[2], last[3]
        else:
            into, mine = self._buffer(output), self._buffer(row)
            self.last = (output, row, into, mine)
        request = self.comm.Iallgather(mine, into)
        test = request.Test
        for _ in SPINS:  # (settled, inline: the check's round is every checked call's)
            if test():
                return None
        for _ in YIELDS:
            yield_core()
            if test():
                return None
        return MPIWork([request], keep=(output, row))


def _copy_out(
    flat: torch.Tensor, tensors: Sequence[torch.Tensor], sizes: Sequence[int] | None = None
) -> Any:
    def then() -> None:
        offset = 0
        for t, size in zip(tensors, sizes or [t.numel() * t.element_size() for t in tensors]):
            if size:
                t.view(-1).view(torch.uint8).copy_(flat[offset : offset + size])
            offset += size

    return then


def _split_bytes(tensor: torch.Tensor, splits: list[int] | None, world: int) -> list[int]:
    nbytes = tensor.numel() * tensor.element_size()
    if splits is None:
        return [nbytes // world] * world
    row = nbytes // max(tensor.shape[0], 1) if tensor.dim() else 0
    return [s * row for s in splits]


class MPIBackend(MPICalls):
    """MPI through mpi4py, on the CPU; the group a torch ``mpi4py`` process group.

    Examples:
        >>> # mpiexec -n 2 python train.py
        >>> commlib.init_dist("mpi")            # doctest: +SKIP
        >>> commlib.get_communicator().backend  # doctest: +SKIP
        'mpi'
    """

    name = "mpi"
    torch_backend = mpi_group.TORCH_BACKEND
    device_type = "cpu"
    description = "CPU collectives through MPI (mpi4py); ranks start with mpiexec"
    native_avg = False
    wire_dtypes = _ALL_DTYPES
    reduce_dtypes = frozenset(_NATIVE_REDUCE) - {torch.complex64, torch.complex128}
    # MPI's nonblocking collectives go on while a wait polls: commlib waits in slices
    interruptible_wait = True
    # the check cannot come off here (mismatched sizes corrupt memory): small results
    # complete from its round, one allgather. Callgrind, rank 0 of 2, instructions a
    # call (riding | MPI's own collective after the round): 4 KiB all_reduce 144K |
    # 259K, reduce 153K | 274K, all_gather_into_tensor 176K | 237K; at 64 KiB the
    # copies into and out of the slot cost more (all_reduce 424K | 356K). A scatter's
    # list and an all_to_all's parts ride whole (MPI sends every rank every slot) and
    # each rank takes its own
    completed_by_check = frozenset(
        {
            "all_reduce",
            "reduce",
            "broadcast",
            "all_gather_into_tensor",
            "gather",
            "reduce_scatter",
            "scatter",
            "all_to_all_single",
            "all_to_all",
        }
    )
    completed_by_check_bytes = 4 << 10
    # a steady checked call goes straight to the round its kind prepared, then (data
    # past the slot) to its lane: the check's host work, not MPI, is most of a small
    # call here (commlib._checked_lanes)
    checked_lanes = True
    # 64 MiB object payloads, 2 ranks, interleaved (loaded machine): all_gather_object
    # 66 ms point to point against 999 ms by padded all_gather; broadcast_object 59 ms
    # against 486 ms by broadcast
    large_payload_transport = "p2p"
    own_rendezvous = True

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("mpi4py") is None:
            return "mpi4py is not installed (pip install 'commlib[mpi]')"
        try:
            MPI = mpi()
            MPI.Get_library_version()
        except Exception as exc:  # the MPI library itself is missing or broken
            return f"mpi4py cannot load an MPI library ({type(exc).__name__}: {exc})"
        return None

    def default_priority(self) -> int | None:
        # only where MPI started the ranks; elsewhere it serves when named
        return 1 if mpi_group.launched_by_mpi() and self.is_available() else None

    def init_process_group(self, **kwargs: Any) -> None:
        """Start the world over ``MPI.COMM_WORLD``; rank and size are MPI's.

        ``store``, ``rank``, ``world_size`` and ``init_method`` are MPI's to
        decide: ranks started by anything but an MPI launcher are refused.
        """
        MPI = mpi_group.start_mpi()
        size = MPI.COMM_WORLD.Get_size()
        wanted = kwargs.pop("world_size", None)
        if wanted not in (None, -1, size):
            raise ValueError(
                f"the mpi backend's world is MPI's: {size} rank(s) here, but world_size="
                f"{wanted} was asked for; start the ranks with mpiexec -n {wanted}"
            )
        kwargs.pop("rank", None)
        kwargs.pop("init_method", None)
        kwargs.pop("store", None)
        timeout = kwargs.get("timeout") or datetime.timedelta(minutes=10)
        kwargs["timeout"] = timeout
        store, rank, size = mpi_group.rendezvous(timeout)
        mpi_group.register()
        kwargs.setdefault("backend", self.torch_backend)  # or commlib-mpi: serve_torch=True
        dist.init_process_group(store=store, rank=rank, world_size=size, **kwargs)

    def set_timeout(self, group: Group, timeout: datetime.timedelta) -> None:
        if isinstance(group, mpi_group.MPIProcessGroup):
            group.timeout = timeout  # for torch.distributed's own waits

    def abort(self, group: Group) -> None:
        if isinstance(group, mpi_group.MPIProcessGroup):
            group.broken = True  # MPI cannot cancel a collective: nothing more to do

    def is_timeout(self, exc: BaseException) -> bool:
        return "timed out" in str(exc).lower()

    def describe_failure(self, exc: BaseException) -> str:
        text = str(exc).strip()
        # MPICH's error stack: the first line says what, the rest is its call path
        return text.splitlines()[0] if text else type(exc).__name__

    def launch_command(self, world_size: int) -> list[str]:
        """``mpiexec -n world_size``: the ``mpiexec`` beside this Python, else the one on PATH.

        Examples:
            >>> MPIBackend().launch_command(2)[1:]
            ['-n', '2']
        """
        here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        found = here if os.access(here, os.X_OK) else shutil.which("mpiexec")
        if found is None:
            raise FileNotFoundError("mpiexec is neither beside this Python nor on PATH")
        return [found, "-n", str(world_size)]


MPIProcessGroupCalls = MPIBackend()
mpi_group.MPIProcessGroup.calls = MPIProcessGroupCalls
# torch knows the backend from here on (new_group(backend="commlib-mpi") makes its group)
mpi_group.register()


def register_torch_backend() -> None:
    """torch 2.14+'s entry point for ``mpi4py``: importing this module registered it.

    The entry point names this module, not :mod:`commlib_backends.mpi_group`,
    so a program that names the backend without importing commlib gets the
    groups' calls with it (the group module then needs no import back here).

    Examples:
        >>> register_torch_backend()          # torch's entry point  # doctest: +SKIP
    """
    mpi_group.register()


@hookimpl
def commlib_backends():
    return [MPIBackend]
