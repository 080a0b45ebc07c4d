"""Collectives issued on the ProcessGroup itself, past torch.distributed's Python layer.

``dist.broadcast`` and its siblings resolve the group, translate ranks, check
their arguments and look for an open coalescing manager before they call the
ProcessGroup's own method. The Communicator has done all of that already
(validated arguments, contiguous tensors on the backend's device, ranks within
the group, membership), and on a small CPU machine the second pass costs
10-45 us a call: a fifth of a small gloo broadcast (150-200 us on 2 ranks).
:class:`DirectCalls` calls the ProcessGroup's methods instead, for the
collectives commlib issues on its hot paths.

A call it cannot serve exactly as torch would goes through torch.distributed
as before: a tensor subclass (its ``__torch_function__`` decides), a group with
an open ``_coalescing_manager``, torch's torchcomms mode, or a torch whose
ProcessGroup lacks the method.

The lanes themselves (the engine issuing the ProcessGroup's call past the
method) are every torch.distributed plugin's: :meth:`commlib.Backend.direct_call`
and :mod:`commlib._torch_lanes`. What this class adds is the same call made from
its methods, for what takes no lane (async calls, another timeout).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from commlib import _torch_facts as torch_facts
from commlib._torch_lanes import ALL_GATHER_SINGLE as _ALL_GATHER_SINGLE
from commlib._torch_lanes import ALL_TO_ALL_SINGLE as _ALL_TO_ALL_SINGLE
from commlib._torch_lanes import COALESCING as _coalescing
from commlib._torch_lanes import REDUCE_SCATTER_SINGLE as _REDUCE_SCATTER_SINGLE
from commlib._torch_lanes import build_options as _build
from commlib.backend import Backend, DirectCall, WorkList
from commlib.types import EngineOp, Group, Work

_torchcomms = torch_facts.torchcomms_mode()


# Parameter turns __torch_function__ off: torch.distributed calls the group directly too
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _plain(*tensors: torch.Tensor) -> bool:
    # any other subclass may route collectives through __torch_function__ (DTensor, ...);
    # a loop, not all() over a generator: this runs on every call
    for t in tensors:
        if type(t) not in _PLAIN:
            return False
    return True


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    # what torch.distributed sends for a complex tensor: its real pairs
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


def _wired(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    # the list itself unless a tensor in it is complex: no new list on every call
    for t in tensors:
        if t.is_complex():
            return [_wire(u) for u in tensors]
    return tensors


def _finish(work: Any, async_op: bool) -> Work | None:
    if async_op:
        return work
    if work is not None:
        work.wait()
    return None


# the options without fields, one per async_op: nothing in them varies between calls
_ALLGATHER = {a: _build(c10d.AllgatherOptions, a) for a in (False, True)}
_ALLTOALL = {a: _build(c10d.AllToAllOptions, a) for a in (False, True)}


class DirectCalls(Backend):
    """Backend mixin: the hot collectives call the ProcessGroup's methods directly.

    Put it after the classes that adapt arguments (``class GlooBackend(EngineGaps,
    DirectCalls)``), so their ``super()`` calls land here.

    A group of one rank sends nothing: its collectives are the identity, or a
    copy (what the engine would compute, without asking it).

    Examples:
        >>> class Fast(DirectCalls):
        ...     name, torch_backend, device_type = "fast-gloo", "gloo", "cpu"
    """

    # the option objects built so far, per class (``torch_reduce_op`` is the class's):
    # keyed by what varies (an op name, a root, async_op), so each is built once
    _direct_options: ClassVar[dict[tuple[Any, ...], Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._direct_options = {}

    def _reduce_options(self, kind: Any, op: EngineOp, root: int, async_op: bool) -> Any:
        """The options of a reduction with ``op`` (and ``root``, -1 for none), built once."""
        key = (kind, op, root, async_op)
        found = self._direct_options.get(key)
        if found is None:
            fields: dict[str, Any] = {"reduceOp": self.torch_reduce_op(op)}
            if root >= 0:
                fields["rootRank"] = root
            found = self._direct_options[key] = _build(kind, async_op, **fields)
        return found

    def _rooted_options(self, kind: Any, root: int, async_op: bool) -> Any:
        """The options of a rooted collective (broadcast, gather, scatter), built once."""
        key = (kind, root, async_op)
        found = self._direct_options.get(key)
        if found is None:
            fields: dict[str, Any] = {"rootRank": root}
            if kind is c10d.BroadcastOptions:
                fields["rootTensor"] = 0
            found = self._direct_options[key] = _build(kind, async_op, **fields)
        return found

    @staticmethod
    def _process_group(group: Group) -> Any:
        """The ProcessGroup to call, or ``None`` where torch.distributed must decide."""
        pg = dist.GroupMember.WORLD if group is None else group
        if _coalescing and pg in _coalescing:
            return None
        if _torchcomms is not None and _torchcomms():
            return None
        return pg

    def direct_call(self, collective: str, group: Group, **key: Any) -> DirectCall | None:
        """The default's lanes (:meth:`Backend.direct_call`), vouched for the methods below.

        Each method here issues, for a plain tensor outside a coalescing
        manager, exactly the ProcessGroup call that lane makes: writing
        ``direct_call`` in this class tells the engine so.

        Examples:
            >>> gloo = commlib.plugins.resolve_backend("gloo")
            >>> gloo.direct_call("all_reduce", group, op="sum", dtype=torch.float32).options
            ... # doctest: +SKIP
        """
        return super().direct_call(collective, group, **key)

    def rank(self, group: Group) -> int:
        """This process's rank within ``group``."""
        pg = dist.GroupMember.WORLD if group is None else group
        return pg.rank() if isinstance(pg, dist.ProcessGroup) else super().rank(group)

    def world_size(self, group: Group) -> int:
        """Number of ranks in ``group``."""
        pg = dist.GroupMember.WORLD if group is None else group
        return pg.size() if isinstance(pg, dist.ProcessGroup) else super().world_size(group)

    def all_reduce(
        self, tensor: torch.Tensor, op: EngineOp, group: Group, async_op: bool = False
    ) -> Work | None:
        """Reduce ``tensor`` in place across ``group`` with ``op``."""
        pg = self._process_group(group) if type(tensor) in _PLAIN else None
        if pg is None:
            return super().all_reduce(tensor, op, group, async_op)
        if pg.size() == 1:
            return None  # every op of one rank's tensor is that tensor
        opts = self._reduce_options(c10d.AllreduceOptions, op, -1, async_op)
        # _wire and _finish inline: the hottest call of all
        wired = torch.view_as_real(tensor) if tensor.is_complex() else tensor
        work = pg.allreduce([wired], opts)
        return work if async_op else _finish(work, False)

    def broadcast(
        self, tensor: torch.Tensor, src: int, group: Group, async_op: bool = False
    ) -> Work | None:
        """Copy ``src``'s ``tensor`` into ``tensor`` on every rank."""
        pg = self._process_group(group) if type(tensor) in _PLAIN else None
        if pg is None:
            return super().broadcast(tensor, src, group, async_op)
        if pg.size() == 1:
            return None
        opts = self._rooted_options(c10d.BroadcastOptions, src, async_op)
        wired = torch.view_as_real(tensor) if tensor.is_complex() else tensor
        work = pg.broadcast([wired], opts)
        return work if async_op else _finish(work, False)

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, group: Group, async_op: bool = False
    ) -> Work | None:
        """Concatenate every rank's ``tensor`` along dim 0 into ``output``."""
        pg = self._process_group(group) if _ALL_GATHER_SINGLE and _plain(output, tensor) else None
        if pg is None:
            return super().all_gather_into_tensor(output, tensor, group, async_op)
        if pg.size() == 1:
            output.copy_(tensor.reshape(output.shape))
            return None
        call = getattr(pg, _ALL_GATHER_SINGLE)  # type: ignore[arg-type]
        return _finish(call(_wire(output), _wire(tensor), _ALLGATHER[async_op]), async_op)

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """Every rank's ``tensor`` into ``tensor_list``."""
        pg = self._process_group(group) if _plain(tensor, *tensor_list) else None
        if pg is None:
            return super().all_gather(tensor_list, tensor, group, async_op)
        if pg.size() == 1:
            tensor_list[0].copy_(tensor.reshape(tensor_list[0].shape))
            return None
        outputs = _wired(tensor_list)
        return _finish(pg.allgather([outputs], [_wire(tensor)], _ALLGATHER[async_op]), async_op)

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: EngineOp,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """``input`` reduced across ``group`` with ``op``; this rank's chunk into ``output``."""
        pg = (
            self._process_group(group)
            if _REDUCE_SCATTER_SINGLE and _plain(output, input)
            else None
        )
        if pg is None:
            return super().reduce_scatter(output, input, op, group, async_op)
        if pg.size() == 1:
            output.copy_(input.reshape(output.shape))
            return None
        # as torch.distributed's reduce_scatter_single: the tensors as they are
        opts = self._reduce_options(c10d.ReduceScatterOptions, op, -1, async_op)
        call = getattr(pg, _REDUCE_SCATTER_SINGLE)  # type: ignore[arg-type]
        return _finish(call(output, input, opts), async_op)

    def all_to_all(
        self,
        output_list: list[torch.Tensor],
        input_list: list[torch.Tensor],
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """``input_list[i]`` to rank ``i``; rank ``i``'s into ``output_list[i]``."""
        pg = self._process_group(group) if _plain(*output_list, *input_list) else None
        if pg is None:
            return super().all_to_all(output_list, input_list, group, async_op)
        if pg.size() == 1:
            output_list[0].copy_(input_list[0].reshape(output_list[0].shape))
            return None
        work = pg.alltoall(_wired(output_list), _wired(input_list), _ALLTOALL[async_op])
        return _finish(work, async_op)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int] | None,
        input_split_sizes: list[int] | None,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """all_to_all_single (see :meth:`Backend.all_to_all_single`)."""
        pg = self._process_group(group) if _ALL_TO_ALL_SINGLE and _plain(output, input) else None
        if pg is None:
            return super().all_to_all_single(
                output, input, output_split_sizes, input_split_sizes, group, async_op
            )
        if pg.size() == 1:
            output.copy_(input.reshape(output.shape))
            return None
        call = getattr(pg, _ALL_TO_ALL_SINGLE)  # type: ignore[arg-type]
        work = call(
            _wire(output),
            _wire(input),
            output_split_sizes or [],
            input_split_sizes or [],
            _ALLTOALL[async_op],
        )
        return _finish(work, async_op)

    def gather(
        self,
        tensor: torch.Tensor,
        gather_list: list[torch.Tensor] | None,
        dst: int,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """Collect every rank's ``tensor`` into ``gather_list`` on ``dst``."""
        pg = self._process_group(group) if _plain(tensor, *(gather_list or ())) else None
        if pg is None:
            return super().gather(tensor, gather_list, dst, group, async_op)
        if pg.size() == 1:
            if gather_list:
                gather_list[0].copy_(tensor.reshape(gather_list[0].shape))
            return None
        # complex as its real pairs: torch.distributed's gather refuses complex tensors
        outputs = [[_wire(t) for t in gather_list]] if gather_list and pg.rank() == dst else []
        opts = self._rooted_options(c10d.GatherOptions, dst, async_op)
        return _finish(pg.gather(outputs, [_wire(tensor)], opts), async_op)

    def scatter(
        self,
        tensor: torch.Tensor,
        scatter_list: list[torch.Tensor] | None,
        src: int,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """Fill ``tensor`` on each rank ``i`` with ``src``'s ``scatter_list[i]``."""
        pg = self._process_group(group) if _plain(tensor, *(scatter_list or ())) else None
        if pg is None:
            return super().scatter(tensor, scatter_list, src, group, async_op)
        if pg.size() == 1:
            if scatter_list:
                tensor.copy_(scatter_list[0].reshape(tensor.shape))
            return None
        inputs = [[_wire(t) for t in scatter_list]] if scatter_list and pg.rank() == src else []
        opts = self._rooted_options(c10d.ScatterOptions, src, async_op)
        return _finish(pg.scatter([_wire(tensor)], inputs, opts), async_op)

    def reduce(
        self, tensor: torch.Tensor, dst: int, op: EngineOp, group: Group, async_op: bool = False
    ) -> Work | None:
        """Reduce ``tensor`` across ``group`` with ``op`` into ``tensor`` on ``dst``."""
        pg = self._process_group(group) if type(tensor) in _PLAIN else None
        if pg is None:
            return super().reduce(tensor, dst, op, group, async_op)
        if pg.size() == 1:
            return None
        opts = self._reduce_options(c10d.ReduceOptions, op, dst, async_op)
        return _finish(pg.reduce([_wire(tensor)], opts), async_op)

    def send(
        self, tensor: torch.Tensor, dst: int, group: Group, async_op: bool = False, tag: int = 0
    ) -> Work | None:
        """Send ``tensor`` to rank ``dst`` of ``group`` (a group rank, as the group takes it)."""
        pg = self._process_group(group) if type(tensor) in _PLAIN else None
        if pg is None:
            return super().send(tensor, dst, group, async_op, tag)
        return WorkList([pg.send([_wire(tensor)], dst, tag)]).result(async_op)

    def recv(
        self, tensor: torch.Tensor, src: int, group: Group, async_op: bool = False, tag: int = 0
    ) -> Work | None:
        """Receive into ``tensor`` what rank ``src`` of ``group`` sends."""
        pg = self._process_group(group) if type(tensor) in _PLAIN else None
        if pg is None:
            return super().recv(tensor, src, group, async_op, tag)
        return WorkList([pg.recv([_wire(tensor)], src, tag)]).result(async_op)
