# torch's stubs type ProcessGroup's methods as the overloads of its C++ bindings; a process
# group written in Python implements the one form torch's dispatch calls (lists, options)
# mypy: disable-error-code="override, assignment, call-arg"
"""MPI under torch.distributed: a ``ProcessGroup`` written in Python over mpi4py.

torch accepts process groups defined in Python (``dist.Backend.register_backend``);
this module registers one as the torch backend ``mpi4py`` (``mpi`` is taken by
torch's own MPI backend, which its pip wheels lack). Each group holds an MPI
communicator (:attr:`MPIProcessGroup.comm`): the world a duplicate of
``MPI.COMM_WORLD``, a subgroup one made by ``Comm.Create_group`` among its
members only. ``torch.distributed`` calls and DDP run on it through
:class:`MPIProcessGroup`'s methods; commlib's ``mpi`` plugin calls mpi4py on
:attr:`MPIProcessGroup.comm` directly, which costs a few microseconds less per
call than torch's dispatch (see docs/backends.md).

:func:`mpi` loads mpi4py's ``MPI`` module once. Importing it loads the MPI
library; when nothing has imported it yet, it is imported without starting
MPI (``mpi4py.rc.initialize``), so ``commlib info`` can say whether MPI is
there without starting it, and :func:`start_mpi` starts MPI when a group is
made.
"""

from __future__ import annotations

import atexit
import datetime
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from commlib._torch_groups import TorchNamed

#: the torch.distributed backend name the process groups register under
TORCH_BACKEND = "mpi4py"

_lock = threading.Lock()
_loaded: dict[str, Any] = {}
# works whose wait timed out: MPI may still read or write their buffers (a collective
# cannot be cancelled), so they stay referenced here until their requests complete
_unfinished: set[MPIWork] = set()


def mpi() -> Any:
    """mpi4py's ``MPI`` module, imported once; raises ``ImportError`` when it cannot load.

    Examples:
        >>> mpi().Get_version()[0] >= 3  # doctest: +SKIP
        True
    """
    module = _loaded.get("MPI")
    if module is not None:
        return module
    with _lock:
        if "MPI" not in _loaded:
            import mpi4py

            if "mpi4py.MPI" not in sys.modules:
                # load the library without starting MPI: start_mpi() does when needed
                before = (mpi4py.rc.initialize, mpi4py.rc.finalize)
                mpi4py.rc.initialize = False
                mpi4py.rc.finalize = False
                try:
                    from mpi4py import MPI
                finally:
                    mpi4py.rc.initialize, mpi4py.rc.finalize = before
            else:
                from mpi4py import MPI
            _loaded["MPI"] = MPI
    return _loaded["MPI"]


def start_mpi() -> Any:
    """Start MPI if nothing has yet (thread level ``MULTIPLE``); return the ``MPI`` module.

    MPI started here is finalized at exit, after commlib's own teardown. A
    process that ends with an uncaught exception aborts the MPI job instead
    (as ``python -m mpi4py`` does): its peers may be inside a collective that
    waits for it, and ``MPI_Finalize`` would wait for them.

    Examples:
        >>> start_mpi().Is_initialized()  # doctest: +SKIP
        True
    """
    MPI = mpi()
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        atexit.register(_finalize)
    if "abort_hook" not in _loaded:
        _loaded["abort_hook"] = sys.excepthook
        sys.excepthook = _note_uncaught
        # registered after MPI's own finalize (ours or mpi4py's), so it runs first
        atexit.register(_abort_after_uncaught)
    return MPI


def _note_uncaught(kind: Any, value: Any, tb: Any) -> None:
    _loaded["uncaught"] = True
    _loaded["abort_hook"](kind, value, tb)


def _abort_after_uncaught() -> None:
    MPI = _loaded["MPI"]
    if _loaded.get("uncaught") and MPI.Is_initialized() and not MPI.Is_finalized():
        if MPI.COMM_WORLD.Get_size() > 1:
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(1)  # the launcher ends the other ranks


def _finalize() -> None:
    MPI = _loaded["MPI"]
    if MPI.Is_initialized() and not MPI.Is_finalized():
        # MPICH's returns even with a collective left pending (measured)
        MPI.Finalize()


def launched_by_mpi() -> bool:
    """Whether an MPI launcher started this process (MPICH's hydra or Open MPI's mpirun).

    Examples:
        >>> launched_by_mpi()     # python script.py
        False
    """
    return "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ


# -- work handles ----------------------------------------------------------------------
#: from this many bytes a wait polls at most _LARGE_PAUSE apart (see MPIWork._poll)
_LARGE, _LARGE_PAUSE = 256 << 10, 50e-6
#: a wait spins this long before it pauses between polls; a ``busy`` work's waits
#: yield the core between polls (no sleep) for their first _BUSY_FOR seconds
_SPIN, _BUSY_FOR = 1e-3, 0.1
#: a work of fewer bytes yields the core between polls while it would spin: its wait
#: is for a peer that is late, and a late peer is often one off its core (the ranks,
#: their engines' threads and other programs outnumber the cores). A rank spinning
#: hot keeps it off: 2 ranks on 2 loaded cores (load 1.8), 8 rows of `commlib bench
#: --strict both` (1 KiB-1 MiB) in turn, hot and yielding: checked geometric mean 775
#: against 105 us, unchecked 588 against 63 (the hot rows' 1-4 ms stalls gone). A large
#: transfer spins hot: MPI moves its data inside the polls
_YIELD_BELOW = _LARGE


def _bytes_of(kept: Any) -> int:
    """The bytes of the tensors (or arrays) a work keeps for MPI: one, or a sequence.

    Examples:
        >>> _bytes_of((torch.ones(3), [torch.ones(2, dtype=torch.float64)], None))
        28
    """
    if kept is None:
        return 0
    if isinstance(kept, (list, tuple)):
        return sum(_bytes_of(k) for k in kept)
    nbytes = getattr(kept, "nbytes", None)
    return int(nbytes) if nbytes is not None else 0


class MPIWork:
    """MPI requests waited for as one operation, with an optional step after them.

    ``wait(timeout)`` polls the requests (MPI has no timed wait) until they
    complete or the time is up; then it raises ``RuntimeError("... Operation
    timed out ...")`` and the requests stay pending: only the wait gave up
    (commlib's ``interruptible_wait``). ``then`` runs once, when they completed.
    ``busy``: MPI moves the request's data only while it is polled, a step a
    poll (MPICH's ``Ialltoallv``), so its wait yields the core between polls
    instead of sleeping.

    Examples:
        >>> work = MPIWork([mpi().COMM_SELF.Ibarrier()])  # doctest: +SKIP
        >>> work.wait(datetime.timedelta(seconds=1)), work.is_completed()  # doctest: +SKIP
        (True, True)
    """

    interruptible = True
    __slots__ = ("keep", "requests", "then", "yield_until")

    def __init__(
        self,
        requests: Sequence[Any],
        then: Callable[[], Any] | None = None,
        keep: Any = None,
        *,
        busy: bool = False,
    ):
        self.requests = list(requests)
        self.then = then
        self.keep = keep  # buffers MPI reads or writes until the requests complete
        # a busy request's waits yield until this time (set when first polled): over all
        # its waits, the engine's slices each being one
        self.yield_until = math.inf if busy else 0.0

    def _done(self) -> bool:
        if not self.requests:
            return True
        MPI = _loaded["MPI"]
        if len(self.requests) == 1:
            if not self.requests[0].Test():
                return False
        elif not MPI.Request.Testall(self.requests):
            return False
        self.requests = []
        if _unfinished:
            _unfinished.discard(self)
        return True

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if not self._done():
            if timeout is None:
                _loaded["MPI"].Request.Waitall(self.requests)
                self.requests = []
            else:
                self._poll(timeout.total_seconds())
        then, self.then = self.then, None
        if then is not None:
            then()
        return True

    def _poll(self, seconds: float) -> None:
        start = time.monotonic()
        deadline = start + seconds
        if self.yield_until == math.inf:
            self.yield_until = start + _BUSY_FOR
        yield_until = self.yield_until
        if not yield_until and _bytes_of(self.keep) < _YIELD_BELOW:
            # a small transfer waits for its peer, not for data to move: while it would
            # spin hot, it yields the core, which the peer may need (_YIELD_BELOW's note)
            yield_until = start + _SPIN
        pause = 0.0
        longest: float | None = None
        while not self._done():
            now = time.monotonic()
            if now >= deadline:
                _unfinished.add(self)
                raise RuntimeError(
                    f"MPI: Operation timed out after {seconds:.3f} s "
                    "(the MPI request is still pending)"
                )
            # spin for the first millisecond (small collectives end within it), then
            # sleep a little longer each time, so waiting ranks leave the cores to others;
            # MPI moves data only inside its calls (MPICH's shared memory, in chunks), so
            # a large transfer polls often: at most 50 us apart, not 1 ms. A busy request
            # advances a step a poll: any sleep between polls gates it (raw mpi4py, 2
            # ranks, 16 MiB Ialltoallv: polls 20 us apart 98 ms, yielding 9 ms, Wait 3-7
            # ms; Ialltoall polled 20 us apart 2 ms), so it yields the core instead
            if now < yield_until:
                yield_core()
            elif now - start > _SPIN:
                if longest is None:
                    longest = _LARGE_PAUSE if _bytes_of(self.keep) >= _LARGE else 1e-3
                pause = min(max(pause * 2, 20e-6), longest, max(deadline - now, 0.0))
                time.sleep(pause)

    def is_completed(self) -> bool:
        return self._done()


#: give the core to another runnable thread or process, if any, and come back at once
yield_core = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))


def finish(work: MPIWork, async_op: bool) -> MPIWork | None:
    """``work`` for an async call; otherwise wait for it now and return ``None``.

    Examples:
        >>> finish(MPIWork([]), async_op=False) is None
        True
    """
    if async_op:
        return work
    work.wait()
    return None


# -- the torch process group -----------------------------------------------------------
_TORCH_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "product",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor",
}


def _op_name(op: Any) -> str:
    for torch_op, name in _TORCH_OPS.items():
        if op == torch_op:
            return name
    raise ValueError(f"the mpi4py process group cannot reduce with {op}")


class _TorchWork(dist.Work):
    """An :class:`MPIWork` as torch's ``Work`` (what DDP and ``dist.*`` calls wait on).

    Its timeout is ``limit``: torch 2.14 makes ``Work.timeout`` a read-only
    property (``_torch_facts.WORK_TIMEOUT_READ_ONLY``), which a subclass cannot assign.
    """

    def __init__(
        self, work: MPIWork | None, result: list[torch.Tensor], timeout: datetime.timedelta
    ):
        super().__init__()
        self.work, self.tensors, self.limit = work, result, timeout

    @property
    def timeout(self) -> datetime.timedelta:  # torch 2.14's Work.timeout, read-only there too
        return self.limit

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self.work is not None:
            # torch passes 0 for "the group's timeout"
            self.work.wait(timeout or self.limit)
        return True

    def is_completed(self) -> bool:
        return self.work is None or self.work.is_completed()

    def result(self) -> list[torch.Tensor]:
        return self.tensors

    def get_future(self) -> torch.futures.Future:
        # DDP chains its gradient buckets on this: complete when the requests are
        self.wait()
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self.tensors)
        return future


class MPIProcessGroup(TorchNamed, dist.ProcessGroup):  # type: ignore[misc]  # names: see TorchNamed
    """A torch ``ProcessGroup`` whose collectives are MPI's, on :attr:`comm`.

    ``calls`` is the commlib ``mpi`` plugin: its methods issue the MPI calls,
    so torch.distributed, DDP and commlib share one implementation.

    Examples:
        >>> dist.init_process_group("mpi4py", ...)  # under mpiexec  # doctest: +SKIP
        >>> dist.group.WORLD.comm.Get_size() == dist.get_world_size()  # doctest: +SKIP
        True
    """

    calls: Any = None  # set by the plugin module: the mpi backend's instance

    def __init__(self, comm: Any, global_ranks: Sequence[int], timeout: datetime.timedelta):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = comm
        self.global_ranks = list(global_ranks)
        self.timeout = timeout
        self.broken = False

    def getBackendName(self) -> str:
        return TORCH_BACKEND

    def _work(self, work: Any, tensors: list[torch.Tensor]) -> _TorchWork:
        return _TorchWork(work, tensors, self.timeout)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> _TorchWork:
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        works = [self.calls.all_reduce(t, op, self, async_op=True) for t in tensors]
        return self._work(MPIWork([r for w in works if w for r in w.requests]), tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> _TorchWork:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> _TorchWork:
        works = [self.calls.broadcast(t, opts.rootRank, self, async_op=True) for t in tensors]
        return self._work(MPIWork([r for w in works if w for r in w.requests]), tensors)

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> _TorchWork:
        work = self.calls.all_gather(outputs[0], inputs[0], self, async_op=True)
        return self._work(work, outputs[0])

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> _TorchWork:
        work = self.calls.all_gather_into_tensor(output, input, self, async_op=True)
        return self._work(work, [output])

    _allgather_base = all_gather_single

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> _TorchWork:
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        work = self.calls.reduce_scatter(output, input, op, self, async_op=True)
        return self._work(work, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> _TorchWork:
        op = _op_name(opts.reduceOp)
        work = self.calls.reduce(tensors[0], opts.rootRank, op, self, async_op=True)
        return self._work(work, tensors)

    def gather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> _TorchWork:
        into = outputs[0] if outputs and outputs[0] else None
        work = self.calls.gather(inputs[0], into, opts.rootRank, self, async_op=True)
        return self._work(work, inputs)

    def scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> _TorchWork:
        parts = inputs[0] if inputs and inputs[0] else None
        work = self.calls.scatter(outputs[0], parts, opts.rootRank, self, async_op=True)
        return self._work(work, outputs)

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> _TorchWork:
        work = self.calls.all_to_all_single(
            output,
            input,
            output_split_sizes or None,
            input_split_sizes or None,
            self,
            async_op=True,
        )
        return self._work(work, [output])

    all_to_all_single = alltoall_base

    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> _TorchWork:
        work = self.calls.all_to_all(outputs, inputs, self, async_op=True)
        return self._work(work, outputs)

    def barrier(self, opts: Any = None) -> _TorchWork:
        return self._work(MPIWork([self.comm.Ibarrier()]), [])

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> _TorchWork:
        return self._work(self.calls.send(tensors[0], dst, self, async_op=True, tag=tag), tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> _TorchWork:
        return self._work(self.calls.recv(tensors[0], src, self, async_op=True, tag=tag), tensors)


def _create(options: Any, backend_options: Any) -> MPIProcessGroup:
    """torch's factory for ``mpi4py`` groups: the world, a subgroup, a shrunk group.

    Called by torch on the group's members only, which is what
    ``Comm.Create_group`` needs: the others take no part.
    """
    if MPIProcessGroup.calls is None:
        # torch's entry point loads the plugin module, which gives the groups their calls
        raise RuntimeError(
            "the mpi4py torch backend is commlib's mpi plugin: import commlib_backends.mpi "
            "(or commlib) before torch.distributed makes an mpi4py group"
        )
    MPI = start_mpi()
    world = _world_comm()
    ranks = list(options.global_ranks_in_group or range(options.group_size))
    if ranks == list(range(world.Get_size())):
        comm = world.Dup()
    else:
        comm = world.Create_group(world.Get_group().Incl(ranks))
    if comm.Get_size() != options.group_size or comm.Get_rank() != options.group_rank:
        raise RuntimeError(
            f"the mpi4py group of ranks {ranks} has rank {comm.Get_rank()} of "
            f"{comm.Get_size()} here, torch expected rank {options.group_rank} of "
            f"{options.group_size}: start every rank under one mpiexec"
        )
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return MPIProcessGroup(comm, ranks, options.timeout)


def _world_comm() -> Any:
    comm = _loaded.get("world")
    if comm is None:
        MPI = start_mpi()
        # a duplicate of COMM_WORLD: the groups' messages never meet the user's own
        comm = _loaded["world"] = MPI.COMM_WORLD.Dup()
    return comm


def register() -> None:
    """Register the ``mpi4py`` torch.distributed backend (once; later calls do nothing).

    The one way commlib's torch backends reach torch
    (:mod:`commlib.torch_backend.registration`): the plugin module registers
    it when imported, and torch 2.14+ finds it through its
    ``torch.distributed.backends`` entry point (which loads that module).

    Examples:
        >>> register()                      # commlib's mpi plugin does, on init  # doctest: +SKIP
        >>> "mpi4py" in dist.Backend.backend_list  # doctest: +SKIP
        True
    """
    from commlib.torch_backend import registration

    registration.register(TORCH_BACKEND, _create, devices=["cpu"])


def rendezvous(timeout: datetime.timedelta) -> tuple[dist.Store, int, int]:
    """A TCPStore every rank of ``MPI.COMM_WORLD`` joins, hosted by rank 0; rank and size.

    Rank 0 binds a port the OS picks and tells the others through MPI, with
    its address: ``127.0.0.1`` when every rank runs on its machine, else
    ``MASTER_ADDR`` or the address rank 0's host name resolves to. With
    ``MASTER_ADDR`` and ``MASTER_PORT`` set, the store is there.

    Examples:
        >>> store, rank, size = rendezvous(datetime.timedelta(seconds=60))  # doctest: +SKIP
    """
    MPI = start_mpi()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    hosts = world.allgather(MPI.Get_processor_name())
    address = os.environ.get("MASTER_ADDR")
    port = int(os.environ.get("MASTER_PORT", 0))
    if address is None:
        address = "127.0.0.1" if len(set(hosts)) == 1 else socket.gethostbyname(hosts[0])
    store = None
    if rank == 0:
        try:
            store = dist.TCPStore(
                address, port, size, True, timeout=timeout, wait_for_workers=False
            )
            port = store.port
        except Exception as exc:
            world.bcast(repr(exc), root=0)
            raise
    found = world.bcast(port, root=0)
    if isinstance(found, str):
        raise RuntimeError(f"rank 0 could not host the store at {address}: {found}")
    if store is None:
        store = dist.TCPStore(address, found, size, False, timeout=timeout)
    return store, rank, size
