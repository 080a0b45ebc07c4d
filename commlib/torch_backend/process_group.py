# torch's stubs type ProcessGroup's methods as the overloads of its C++ bindings; a process
# group written in Python implements the one form torch's dispatch calls (lists, options)
# mypy: disable-error-code="override, assignment, call-arg"
"""A torch ``ProcessGroup`` whose collectives a :class:`~commlib.Communicator` performs.

torch hands a group written in Python every collective of its programs:
``torch.distributed``'s functions, DDP's gradient buckets and its start-up
checks, FSDP's all-gathers and reduce-scatters, the object collectives.
:class:`CommlibProcessGroup` passes each to its communicator, over the
plugin's own group (:attr:`CommlibProcessGroup.inner`: a gloo group for
``commlib-gloo``, the ``mpi4py`` group for ``commlib-mpi``), so torch's
traffic gets what commlib's own calls get: the argument check in the
plugin's default mode, the timeout, the observers, the flight recorder and
``COMMLIB_STATS``. Its ranks are the group's, as torch passes them.

The communicator is made at the group's first collective, when torch has
finished starting the world (a communicator asks it who the group's ranks are).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from commlib import _torch_facts as torch_facts
from commlib import plugins
from commlib._torch_groups import TorchNamed
from commlib.backend import Backend
from commlib.communicator import Communicator
from commlib.errors import BackendUnavailableError
from commlib.handle import Handle
from commlib.torch_backend import registration, shrinking

__all__ = ["CommlibProcessGroup", "CommlibWork", "create"]

_RED: Any = dist.ReduceOp.RedOpType  # torch's stubs lack the enum's members
_OPS = {
    _RED.SUM: "sum",
    _RED.AVG: "mean",
    _RED.PRODUCT: "product",
    _RED.MIN: "min",
    _RED.MAX: "max",
    _RED.BAND: "band",
    _RED.BOR: "bor",
    _RED.BXOR: "bxor",
}


def _op(opts: Any) -> str:
    if opts is None:
        return "sum"
    name = _OPS.get(opts.reduceOp.op)
    if name is None:
        raise ValueError(
            f"a commlib process group cannot reduce with {opts.reduceOp.op.name} "
            "(only some engines reduce with it)"
        )
    return name


class CommlibWork(dist.Work):
    """A commlib :class:`~commlib.Handle` as torch's ``Work`` (what DDP and ``dist.*`` wait on).

    ``then`` runs once the handle is done (copying a gathered buffer into
    torch's output list, say), before ``wait`` returns and before the future
    completes.
    """

    def __init__(
        self,
        handle: Handle | None,
        result: list[torch.Tensor],
        then: Callable[[], None] | None = None,
    ):
        super().__init__()
        self.handle, self.tensors, self.then = handle, result, then

    def _finish(self) -> list[torch.Tensor]:
        then, self.then = self.then, None
        if then is not None:
            then()
        return self.tensors

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self.handle is not None:
            # torch passes 0 (or less) for "the group's timeout"
            self.handle.wait(timeout if timeout and timeout.total_seconds() > 0 else None)
        self._finish()
        return True

    def is_completed(self) -> bool:
        return self.handle is None or self.handle.is_completed()

    def result(self) -> list[torch.Tensor]:
        return self.tensors

    def get_future(self) -> torch.futures.Future:
        if self.handle is None or self.handle.is_completed():
            self.wait()
            done: torch.futures.Future = torch.futures.Future()
            done.set_result(self.tensors)
            return done
        # DDP chains its gradient buckets on this. Not on the engine's own future: gloo runs
        # its callbacks before its work counts as complete, so commlib's wait there hangs
        return self.handle.get_future().then(self._after)

    def _after(self, _: torch.futures.Future) -> list[torch.Tensor]:
        self.wait()  # the engine's work is done: commlib's part, and its errors, mapped
        return self.tensors


def _done(tensors: list[torch.Tensor]) -> CommlibWork:
    return CommlibWork(None, tensors)


class CommlibProcessGroup(TorchNamed, dist.ProcessGroup):  # type: ignore[misc]  # see TorchNamed
    """A torch ``ProcessGroup`` whose collectives :attr:`communicator` performs.

    Made by torch (``init_process_group("commlib-gloo")``, ``new_group(...,
    backend="commlib")``), not by hand.

    Examples:
        >>> dist.init_process_group("commlib-gloo", ...)            # doctest: +SKIP
        >>> dist.group.WORLD.communicator.backend                     # doctest: +SKIP
        'gloo'
    """

    #: what :func:`commlib.torch_backend.is_served` looks for
    commlib_served = True

    def __init__(
        self,
        name: str,
        plugin: Backend,
        inner: Any,
        rank: int,
        size: int,
        timeout: datetime.timedelta,
        comm: Communicator | None = None,
    ):
        super().__init__(rank, size)
        self._backend_name = name
        #: the plugin serving the group, and its own group the communicator serves
        self.plugin, self.inner, self.timeout = plugin, inner, timeout
        self._comm: Communicator | None = comm  # given: a shrunk communicator, adopted
        self._lock = threading.Lock()

    @property
    def communicator(self) -> Communicator:
        """The communicator performing this group's collectives (made when first asked)."""
        comm = self._comm
        if comm is None:
            with self._lock:
                if self._comm is None:
                    # over this group: the communicator serves its inner one, and knows
                    # whether this is the world's
                    self._comm = Communicator(self, backend=self.plugin, timeout=self.timeout)
                comm = self._comm
        return comm

    def getBackendName(self) -> str:
        return self._backend_name

    def shutdown(self) -> None:
        """torch's ``destroy_process_group(group)`` step: the plugin's own group ends with it.

        torch registered :attr:`inner` as a group of its own, so without this
        it outlived the destroyed group in torch's registry (its threads and
        sockets: a program making and destroying groups leaked 3 threads and 5
        sockets a group). Dropping the communicator breaks the cycle through
        it, so the inner group goes with its last Python reference (whose
        destructor, unlike a C++ owner's such as DDP's reducer, lets go of
        the GIL while gloo's threads finish).

        Examples:
            >>> dist.destroy_process_group(group)   # calls this  # doctest: +SKIP
        """
        inner, self._comm = self.inner, None
        if dist.is_initialized() and inner in torch_facts.group_map():
            dist.destroy_process_group(inner)

    # -- collectives, as torch calls them ---------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> CommlibWork:
        op, comm = _op(opts), self.communicator
        if len(tensors) == 1:
            return CommlibWork(comm.all_reduce(tensors[0], op, async_op=True), tensors)
        return _each([comm.all_reduce(t, op, async_op=True) for t in tensors], tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> CommlibWork:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> CommlibWork:
        comm, root = self.communicator, opts.rootRank
        if len(tensors) == 1:
            return CommlibWork(comm.broadcast(tensors[0], root, async_op=True), tensors)
        return _each([comm.broadcast(t, root, async_op=True) for t in tensors], tensors)

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> CommlibWork:
        comm, tensor, into = self.communicator, inputs[0], outputs[0]
        if all(o.shape == tensor.shape and o.dtype == tensor.dtype for o in into):
            # one all_gather_into_tensor: the ranks' lengths are checked to agree
            flat = tensor.new_empty(len(into) * tensor.numel())
            handle = comm.all_gather_into_tensor(flat, tensor.reshape(-1), async_op=True)

            def scatter_back() -> None:
                for out, part in zip(into, flat.chunk(len(into))):
                    out.copy_(part.view_as(out))

            return CommlibWork(handle, into, scatter_back)
        # shapes that differ between ranks (torch allows it where its engine does)
        for out, part in zip(into, comm.all_gather(tensor)):
            out.copy_(part)
        return _done(into)

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> CommlibWork:
        handle = self.communicator.all_gather_into_tensor(output, input, async_op=True)
        return CommlibWork(handle, [output])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> CommlibWork:
        gather = self.communicator.all_gather_into_tensor
        handles = [gather(o, i, async_op=True) for o, i in zip(outputs, inputs)]
        return _each(handles, outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None
    ) -> CommlibWork:
        handle = self.communicator.reduce_scatter(outputs[0], inputs[0], _op(opts), async_op=True)
        return CommlibWork(handle, outputs)

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> CommlibWork:
        handle = self.communicator.reduce_scatter(output, input, _op(opts), async_op=True)
        return CommlibWork(handle, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> CommlibWork:
        comm, op = self.communicator, _op(opts)
        handles = [comm.reduce_scatter(o, i, op, async_op=True) for o, i in zip(outputs, inputs)]
        return _each(handles, outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> CommlibWork:
        handle = self.communicator.reduce(tensors[0], opts.rootRank, _op(opts), async_op=True)
        return CommlibWork(handle, tensors)

    def gather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> CommlibWork:
        gathered = self.communicator.gather(inputs[0], opts.rootRank)
        if outputs and outputs[0]:
            for out, part in zip(outputs[0], gathered):
                out.copy_(part)
        return _done(outputs[0] if outputs else [])

    def scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> CommlibWork:
        parts = inputs[0] if inputs and inputs[0] else None
        handle = self.communicator.scatter(outputs[0], parts, opts.rootRank, async_op=True)
        return CommlibWork(handle, outputs)

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> CommlibWork:
        handle = self.communicator.all_to_all_single(
            output, input, output_split_sizes or None, input_split_sizes or None, async_op=True
        )
        return CommlibWork(handle, [output])

    all_to_all_single = alltoall_base

    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> CommlibWork:
        return CommlibWork(self.communicator.all_to_all(outputs, inputs, async_op=True), outputs)

    def barrier(self, opts: Any = None) -> CommlibWork:
        return CommlibWork(self.communicator.barrier(async_op=True), [])

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> CommlibWork:
        handle = self.communicator.send(tensors[0], dst, tag=tag, async_op=True)
        return CommlibWork(handle, tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> CommlibWork:
        handle = self.communicator.recv(tensors[0], src, tag=tag, async_op=True)
        assert isinstance(handle, Handle)
        return CommlibWork(handle, tensors)


class _Handles:
    """Several handles waited for as one (a coalesced call's)."""

    def __init__(self, handles: Sequence[Handle | None]):
        self.handles = [h for h in handles if h is not None]

    def wait(self, timeout: Any = None) -> bool:
        for handle in self.handles:
            handle.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all(h.is_completed() for h in self.handles)

    def get_future(self) -> torch.futures.Future:
        futures = [h.get_future() for h in self.handles]
        return torch.futures.collect_all(futures)


def _each(handles: Sequence[Handle | None], tensors: list[torch.Tensor]) -> CommlibWork:
    return CommlibWork(_Handles(handles), tensors)  # type: ignore[arg-type]


# -- torch's creator --------------------------------------------------------------------
def _plugin(name: str) -> Backend:
    wanted = registration.plugin_of(name)
    plugin = plugins.resolve_backend(wanted) if wanted else plugins.backend_for_group(None)
    reason = plugin.unavailable_reason()
    if reason is not None:
        raise BackendUnavailableError(
            f"torch backend {name!r}: commlib's {plugin.name!r} plugin is not available "
            f"in this process: {reason}"
        )
    if plugin.torch_backend is None:
        raise ValueError(
            f"torch backend {name!r}: commlib's {plugin.name!r} plugin drives no "
            "torch.distributed engine; name a plugin that does (commlib-NAME)"
        )
    return plugin


def create(name: str, options: Any, backend_options: Any) -> CommlibProcessGroup:
    """torch's creator for ``commlib`` groups: the world, a subgroup, a group of a mesh.

    Called by torch on the group's members, with its store: the plugin's own
    group is made here, among the same members, as torch makes groups
    (registered with torch, so its ranks are known), then wrapped.
    """
    plugin = _plugin(name)
    engine = str(plugin.torch_backend)
    # what torch knows of the name: the CPU, and the plugin's own device
    devices = dist.Backend.backend_capability.setdefault(name, ["cpu"])
    if plugin.device_type not in devices:
        devices.append(plugin.device_type)
    size, rank, timeout = options.group_size, options.group_rank, options.timeout
    shrunk = shrinking.adopted()
    if shrunk is not None:  # torch_backend.shrink: the survivors' communicator serves it
        return CommlibProcessGroup(name, plugin, shrunk.group, rank, size, timeout, shrunk)
    members = list(options.global_ranks_in_group)
    group_name: Any = getattr(c10d, "GroupName", str)(f"{options.group_id}/{engine}")
    inner, _ = torch_facts.new_process_group_helper()(
        size,
        rank,
        members,  # empty for the world, as torch passes it
        engine,
        options.store,
        group_name,
        timeout=timeout,
        group_desc=f"{name}'s {engine} group",
    )
    ranks = {g: i for i, g in enumerate(members or range(size))}
    torch_facts.c10d_world().pg_group_ranks[inner] = ranks
    return CommlibProcessGroup(name, plugin, inner, rank, size, timeout)
