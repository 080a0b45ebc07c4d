"""What an engine lacks, supplied: dtypes it cannot move, reductions it cannot do.

A backend states what its library handles (``wire_dtypes``, ``reduce_dtypes``,
``reduce_ops``, ``native_gather``); :class:`EngineGaps` sends the rest as raw
bytes, or as an all_gather followed by a reduction on this rank, in rank order.
Where the library's own algorithm is slow for large gathers
(``p2p_gather_bytes``), they go point to point instead. gloo and the
accelerator backends share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from commlib._lanes import vouched_for
from commlib.backend import Backend, DirectCall, ThenWork
from commlib.dtypes import byte_view
from commlib.reductions import reduce_into, reduce_locally
from commlib.types import EngineOp, Group, P2PRequest, Work

_REAL_OF_COMPLEX = {
    torch.complex32: torch.float16,
    torch.complex64: torch.float32,
    torch.complex128: torch.float64,
}


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat ``uint8`` view of a contiguous tensor (writes land in ``tensor``).

    Examples:
        >>> as_bytes(torch.zeros(2, dtype=torch.float64)).shape
        torch.Size([16])
    """
    return byte_view(tensor)


# the dtypes every engine here moves and reduces; each plugin states its own on top
STANDARD_DTYPES: frozenset[torch.dtype] = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
    }
)


def _same_shape(*lists: list[torch.Tensor]) -> bool:
    # a loop that stops at the first difference: this runs on every all_to_all
    shape = lists[0][0].shape if lists[0] else None
    for tensors in lists:
        for t in tensors:
            if t.shape != shape:
                return False
    return True


class EngineGaps(Backend):
    """Backend defaults that route around what the engine cannot do.

    Class attributes a subclass sets:

    * ``wire_dtypes``: dtypes the engine moves (others travel as bytes);
    * ``reduce_dtypes`` / ``reduce_ops``: what it reduces itself (others are
      gathered and reduced here, in rank order, so every rank gets the same bits);
    * ``native_gather``: whether it has ``gather`` (else an all_gather kept on dst);
    * ``native_scatter``: whether it has ``scatter`` (else a broadcast of the
      whole list from src, each rank keeping its part);
    * ``p2p_gather_bytes``: from how many bytes per rank ``all_gather``,
      ``all_gather_into_tensor`` and ``gather`` go point to point, each rank
      sending its tensor straight to every rank that needs it (``None``:
      never). For engines whose point-to-point moves large tensors faster
      than their gathers do (gloo).
    * ``small_exchange_bytes``: up to how many bytes gathered in all (the
      world times one rank's tensor) ``all_gather``, ``all_gather_into_tensor``
      and ``all_reduce`` go through one ``all_to_all_single`` (each rank's
      tensor repeated for every rank; ``all_reduce`` then reduces locally, in
      rank order), and ``reduce`` through a ``gather`` to ``dst`` and a local
      reduction (``None``: never). For engines whose all_to_all is cheaper
      than their gathers and reductions of small tensors (gloo).
    * ``reduce_scatter_by_all_to_all``: ``reduce_scatter`` of any size sends
      each rank its chunk in one ``all_to_all_single`` and reduces locally, in
      rank order (small ones do so with ``small_exchange_bytes`` alone).
    """

    reduce_ops: ClassVar[frozenset[str]] = frozenset(
        {"sum", "product", "min", "max", "band", "bor", "bxor"}
    )
    reduce_dtypes: ClassVar[frozenset[torch.dtype]] = frozenset()
    wire_dtypes: ClassVar[frozenset[torch.dtype]] = frozenset()
    native_gather: ClassVar[bool] = True
    native_scatter: ClassVar[bool] = True
    p2p_gather_bytes: ClassVar[int | None] = None
    small_exchange_bytes: ClassVar[int | None] = None
    reduce_scatter_by_all_to_all: ClassVar[bool] = False

    # -- what the library handles itself ---------------------------------------------
    def _wire_ok(self, dtype: torch.dtype) -> bool:
        return _REAL_OF_COMPLEX.get(dtype, dtype) in self.wire_dtypes

    def reduces_natively(self, op: str, dtype: torch.dtype) -> bool:
        """Whether the library reduces ``dtype`` with ``op`` (an engine op name).

        Examples:
            >>> commlib.plugins.resolve_backend("nccl").reduces_natively("band", torch.int64)
            False
        """
        if dtype.is_complex:
            # torch reduces complex tensors as pairs of reals, for sums only
            return (
                op in ("sum", "avg")
                and "sum" in self.reduce_ops
                and (_REAL_OF_COMPLEX[dtype] in self.reduce_dtypes)
            )
        return (op in self.reduce_ops or (op == "avg" and self.native_avg)) and (
            dtype in self.reduce_dtypes
        )

    def gathers_p2p(self, tensor: torch.Tensor, group: Group) -> bool:
        """Whether gathering ``tensor`` from every rank of ``group`` goes point to point.

        Every rank decides alike: on the size of its own ``tensor``, which
        the gathers need to be the same everywhere.

        Examples:
            >>> gloo = commlib.plugins.resolve_backend("gloo")
            >>> gloo.gathers_p2p(torch.empty(16 << 20, dtype=torch.uint8), None)
            True
            >>> gloo.gathers_p2p(torch.empty(1024, dtype=torch.uint8), None)
            False
        """
        limit = self.p2p_gather_bytes
        return limit is not None and tensor.numel() * tensor.element_size() >= limit

    def exchanges_small(self, tensor: torch.Tensor, group: Group) -> bool:
        """Whether gathering ``tensor`` from every rank goes through one all_to_all.

        Every rank decides alike, on the size of its own ``tensor`` (which the
        collectives need to be the same everywhere).

        Examples:
            >>> gloo = commlib.plugins.resolve_backend("gloo")
            >>> gloo.exchanges_small(torch.empty(1024, dtype=torch.uint8), group)  # doctest: +SKIP
            True
            >>> gloo.exchanges_small(torch.empty(8 << 20, dtype=torch.uint8), group)  # 2 ranks
            ... # doctest: +SKIP
            False
        """
        limit = self.small_exchange_bytes
        if limit is None:
            return False
        world = self.world_size(group)
        # a group of one exchanges nothing: its engine calls are the identity
        return world > 1 and 0 < tensor.numel() * tensor.element_size() * world <= limit

    def gather_by_all_to_all(
        self, output: torch.Tensor, tensor: torch.Tensor, group: Group, async_op: bool = False
    ) -> Work | None:
        """Every rank's ``tensor`` into ``output`` (contiguous, ``world`` times its bytes).

        One ``all_to_all_single`` whose input is ``tensor`` once for every
        rank: what an all_gather does, in the engine's all_to_all.

        Examples:
            >>> gloo = commlib.plugins.resolve_backend("gloo")
            >>> out = torch.empty(2 * 4)                                # doctest: +SKIP
            >>> gloo.gather_by_all_to_all(out, torch.ones(4), group)  # every rank of 2
            ... # doctest: +SKIP
        """
        world = self.world_size(group)
        if output.dtype == tensor.dtype and output.dim() == 1 and tensor.dim() == 1:
            # typed as they are (all_to_all_single sends what gloo cannot move as
            # bytes itself): two view ops less on a path that runs for every small call
            output_flat, mine = output, tensor
        else:
            output_flat, mine = as_bytes(output), as_bytes(tensor)
        repeated = torch.cat([mine] * world)  # one op: cheaper than expand and reshape
        return self.all_to_all_single(output_flat, repeated, None, None, group, async_op)

    def gather_p2p(
        self,
        parts: Sequence[torch.Tensor] | None,
        tensor: torch.Tensor,
        dst: int | None,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """Gather ``tensor`` into ``parts[r]`` (rank ``r``'s) point to point, directly.

        ``dst=None`` gathers on every rank (all_gather), otherwise on ``dst``
        only; ``parts`` is ``None`` where nothing is received. Each rank posts
        its sends to every rank that needs its tensor and its receives from
        every other rank at once, starting with its neighbours so that no rank
        is every rank's first peer; the result is one
        :class:`~commlib.backend.WorkList` (waited through the engine, with
        its timeout) or, blocking, ``None`` once all completed. Measured on
        gloo against a ring (one neighbour per step, n - 1 steps): as fast at
        2 ranks, faster at 3 and 4.

        Examples:
            >>> gloo = commlib.plugins.resolve_backend("gloo")
            >>> parts = [torch.empty(4) for _ in range(2)]              # doctest: +SKIP
            >>> gloo.gather_p2p(parts, torch.ones(4), None, group)    # every rank of 2
            ... # doctest: +SKIP
        """
        world, me = self.world_size(group), self.rank(group)
        others = [(me + k) % world for k in range(1, world)]
        sends = [(tensor, r) for r in others if dst is None or r == dst]
        recvs: list[tuple[torch.Tensor, int]] = []
        if parts is not None and (dst is None or dst == me):
            recvs = [(parts[(me - k) % world], (me - k) % world) for k in range(1, world)]
            parts[me].copy_(tensor.view(parts[me].shape))
        return self.exchange(sends, recvs, group, async_op)

    def direct_call(self, collective: str, group: Group, **key: Any) -> DirectCall | None:
        """The engine's own call, for the dtypes, ops and sizes the methods below pass through.

        None where they compose (bytes for a dtype the library cannot move, a
        gather and a local reduction); the sizes that take another path
        (``small_exchange_bytes``, ``p2p_gather_bytes``) are left out of the
        call's byte range.

        Examples:
            >>> gloo = commlib.plugins.resolve_backend("gloo")
            >>> gloo.direct_call("all_reduce", group, op="band", dtype=torch.float32)  # None
            ... # doctest: +SKIP
        """
        if collective == "all_gather_slots":
            # the rows gathered as one all_gather_into_tensor of the first, or (apart=True)
            # sent row j to rank j in one all_to_all_single (see all_gather_slots), unless
            # this class changed how it gathers or exchanges bytes
            apart = bool(key.get("apart", False))
            via = "all_to_all_single" if apart else "all_gather_into_tensor"
            own = getattr(type(self), via) is getattr(EngineGaps, via)
            rows_apart = self.sends_slot_rows_apart(self.world_size(group), key["slot_bytes"])
            if not own or rows_apart != apart:
                return None
            found = self.direct_call(via, group, dtype=torch.uint8)
            return None if found is None or found.call is None else found
        dtype: torch.dtype | None = key.get("dtype")
        if dtype is not None and not self._wire_ok(dtype):
            return None
        if collective == "scatter" and not self.native_scatter:
            # the root's whole list broadcast (see scatter): the broadcast's lane, where
            # the broadcast scatter calls is the one this direct_call names
            if not vouched_for(type(self), "broadcast"):
                return None
            found = self.direct_call("broadcast", group, src=key["src"], dtype=dtype)
            return None if found is None or found.call is None else found._replace(via="broadcast")
        op = key.get("op")
        if op is not None and dtype is not None and not self.reduces_natively(op, dtype):
            return None
        found = super().direct_call(collective, group, **key)
        if found is None or found.call is None:
            return found
        world = self.world_size(group)
        low, high = 0, found.max_bytes
        small = self.small_exchange_bytes
        if small is not None and collective in ("all_reduce", "all_gather_into_tensor"):
            low = small // world + 1
        elif small is not None and collective == "reduce" and self.native_gather:
            low = small // world + 1
        elif collective == "reduce_scatter":
            if self.reduce_scatter_by_all_to_all:
                return None
            if small is not None:
                low = small // world + 1
        if collective == "all_gather_into_tensor" and self.p2p_gather_bytes is not None:
            high = self.p2p_gather_bytes - 1
        return found._replace(min_bytes=low, max_bytes=high)

    # -- tensor collectives ------------------------------------------------------------
    # A composed path returns the engine's work with its local step to follow
    # (ThenWork), or None once it finished: both as the contract allows.
    def all_reduce(
        self, tensor: torch.Tensor, op: EngineOp, group: Group, async_op: bool = False
    ) -> Work | None:
        """The library's all_reduce, or a gather and a local reduction in rank order.

        Small tensors (``small_exchange_bytes``) and what the library cannot
        reduce take the gather.
        """
        # no call to exchanges_small where the backend never exchanges small ones
        small = self.small_exchange_bytes is not None and self.exchanges_small(tensor, group)
        if not small and self.reduces_natively(op, tensor.dtype):
            return super().all_reduce(tensor, op, group, async_op)
        if not tensor.numel():
            return None
        parts = tensor.new_empty((self.world_size(group), *tensor.shape))
        work = self.all_gather_into_tensor(parts.view(-1), tensor.reshape(-1), group, async_op)
        return ThenWork.of(work, lambda: reduce_into(tensor, parts.unbind(0), op))

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: EngineOp,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """The library's reduce_scatter, or an all_to_all and a local reduction in rank order.

        The all_to_all sends each rank its chunk, so each rank reduces only
        its own: with ``reduce_scatter_by_all_to_all``, for small inputs
        (``small_exchange_bytes``) and for what the library cannot reduce.
        """
        composed = self.reduce_scatter_by_all_to_all or self.exchanges_small(output, group)
        if not composed and self.reduces_natively(op, input.dtype):
            return super().reduce_scatter(output, input, op, group, async_op)
        if not output.numel():
            return None
        world = self.world_size(group)
        chunks = torch.empty_like(input)
        work = self.all_to_all_single(chunks.view(-1), input.view(-1), None, None, group, async_op)

        def then() -> None:
            output.copy_(reduce_locally(chunks.view(world, -1).unbind(0), op).view_as(output))

        return ThenWork.of(work, then)

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        group: Any,
        async_op: bool = False,
    ) -> Any:
        """all_gather; dtypes the library cannot move travel as bytes; large ones p2p.

        Small ones (``small_exchange_bytes``) go through one all_to_all.
        """
        if self.gathers_p2p(tensor, group):
            return self.gather_p2p(tensor_list, tensor, None, group, async_op)
        if self.exchanges_small(tensor, group):
            nbytes = tensor.numel() * tensor.element_size()
            flat = torch.empty(len(tensor_list) * nbytes, dtype=torch.uint8, device=tensor.device)
            work = self.gather_by_all_to_all(flat, tensor, group, async_op)

            def then() -> None:
                rows = flat.view(len(tensor_list), -1)
                for out, row in zip(tensor_list, rows.unbind(0)):
                    out.copy_(row.view(tensor.dtype).view(out.shape))

            return ThenWork.of(work, then)
        if self._wire_ok(tensor.dtype):
            return super().all_gather(tensor_list, tensor, group, async_op)
        raw = [as_bytes(t) for t in tensor_list]
        return super().all_gather(raw, as_bytes(tensor), group, async_op)

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, group: Any, async_op: bool = False
    ) -> Any:
        """all_gather_into_tensor; dtypes the engine cannot move as bytes; large ones p2p.

        Small ones (``small_exchange_bytes``) go through one all_to_all.
        """
        if self.gathers_p2p(tensor, group):
            parts = output.view(self.world_size(group), *tensor.shape)
            return self.gather_p2p(list(parts.unbind(0)), tensor, None, group, async_op)
        if self.exchanges_small(tensor, group):
            return self.gather_by_all_to_all(output, tensor, group, async_op)
        if self._wire_ok(tensor.dtype):
            return super().all_gather_into_tensor(output, tensor, group, async_op)
        return super().all_gather_into_tensor(as_bytes(output), as_bytes(tensor), group, async_op)

    def all_gather_slots(
        self, output: torch.Tensor, slots: torch.Tensor, group: Group, async_op: bool = False
    ) -> Work | None:
        """all_gather_slots; small repeated ones as one all_to_all of ``slots`` as they are."""
        rows, size = slots.shape
        # output holds a slot from every rank: as many bytes as slots repeated per rank
        if rows * size == output.numel() and self.sends_slot_rows_apart(rows, size):
            return self.all_to_all_single(output, slots, None, None, group, async_op)
        return super().all_gather_slots(output, slots, group, async_op)

    def sends_slot_rows_apart(self, world: int, slot_bytes: int) -> bool:
        """Up to ``small_exchange_bytes`` in all: one all_to_all sends row ``j`` to rank ``j``.

        Not where a subclass gathers slots its own way: its rows may not go apart.
        """
        limit = self.small_exchange_bytes
        return (
            limit is not None
            and 0 < world * slot_bytes <= limit
            and type(self).all_gather_slots is EngineGaps.all_gather_slots
        )

    def broadcast(self, tensor: torch.Tensor, src: int, group: Any, async_op: bool = False) -> Any:
        """broadcast; dtypes the library cannot move travel as bytes."""
        if self._wire_ok(tensor.dtype):
            return super().broadcast(tensor, src, group, async_op)
        return super().broadcast(as_bytes(tensor), src, group, async_op)

    def gather(
        self,
        tensor: torch.Tensor,
        gather_list: list[torch.Tensor] | None,
        dst: int,
        group: Any,
        async_op: bool = False,
    ) -> Any:
        """The library's gather (large ones p2p), or an all_gather only ``dst`` keeps."""
        if self.native_gather and self.gathers_p2p(tensor, group):
            return self.gather_p2p(gather_list, tensor, dst, group, async_op)
        if self.native_gather:
            if self._wire_ok(tensor.dtype):
                return super().gather(tensor, gather_list, dst, group, async_op)
            raw = None if gather_list is None else [as_bytes(t) for t in gather_list]
            return super().gather(as_bytes(tensor), raw, dst, group, async_op)
        out = gather_list
        if out is None:
            out = [torch.empty_like(tensor) for _ in range(self.world_size(group))]
        self.all_gather(out, tensor, group)
        return None

    def reduce(
        self, tensor: torch.Tensor, dst: int, op: EngineOp, group: Group, async_op: bool = False
    ) -> Work | None:
        """The library's reduce, or a gather to ``dst`` and a local reduction in rank order.

        Small tensors (``small_exchange_bytes``) and what the library cannot
        reduce take the gather.
        """
        small = (
            self.native_gather
            and self.small_exchange_bytes is not None
            and self.exchanges_small(tensor, group)
        )
        if not small and self.reduces_natively(op, tensor.dtype):
            return super().reduce(tensor, dst, op, group, async_op)
        if not tensor.numel():
            return None
        me = self.rank(group)
        parts = tensor.new_empty((self.world_size(group), *tensor.shape))
        into = list(parts.unbind(0)) if me == dst else None
        work = self.gather(tensor, into, dst, group, async_op)
        if me != dst:
            return work
        return ThenWork.of(work, lambda: reduce_into(tensor, parts.unbind(0), op))

    def scatter(
        self,
        tensor: torch.Tensor,
        scatter_list: list[torch.Tensor] | None,
        src: int,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """The library's scatter, or a broadcast of the whole list keeping this rank's part."""
        if self.native_scatter:
            if self._wire_ok(tensor.dtype):
                return super().scatter(tensor, scatter_list, src, group, async_op)
            raw = None if scatter_list is None else [as_bytes(t) for t in scatter_list]
            return super().scatter(as_bytes(tensor), raw, src, group, async_op)
        world, me = self.world_size(group), self.rank(group)
        if me == src and scatter_list is not None:
            whole = torch.stack([t.reshape(tensor.shape) for t in scatter_list])
        else:
            whole = tensor.new_empty((world, *tensor.shape))
        self.broadcast(whole, src, group)
        tensor.copy_(whole[me])
        return None

    def all_to_all(
        self,
        output_list: list[torch.Tensor],
        input_list: list[torch.Tensor],
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """all_to_all; tensors of different shapes go as one all_to_all_single.

        gloo's own all_to_all takes tensors of one shape only; dtypes the
        library cannot move travel as bytes.
        """
        if not _same_shape(output_list, input_list):
            out_sizes = [t.numel() for t in output_list]
            in_sizes = [t.numel() for t in input_list]
            flat_out = output_list[0].new_empty(sum(out_sizes))
            flat_in = torch.cat([t.reshape(-1) for t in input_list])
            self.all_to_all_single(flat_out, flat_in, out_sizes, in_sizes, group)
            for t, part in zip(output_list, flat_out.split(out_sizes)):
                t.copy_(part.view(t.shape))
            return None
        if self._wire_ok(input_list[0].dtype):
            return super().all_to_all(output_list, input_list, group, async_op)
        raw_out = [as_bytes(t) for t in output_list]
        return super().all_to_all(raw_out, [as_bytes(t) for t in input_list], group, async_op)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int] | None,
        input_split_sizes: list[int] | None,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """all_to_all_single; dtypes the library cannot move travel as bytes (splits in bytes)."""
        if self._wire_ok(input.dtype):
            return super().all_to_all_single(
                output, input, output_split_sizes, input_split_sizes, group, async_op
            )
        raw_out, raw_in = as_bytes(output), as_bytes(input)
        out_row = raw_out.numel() // max(output.shape[0], 1) if output.dim() else 0
        in_row = raw_in.numel() // max(input.shape[0], 1) if input.dim() else 0
        return super().all_to_all_single(
            raw_out,
            raw_in,
            None if output_split_sizes is None else [n * out_row for n in output_split_sizes],
            None if input_split_sizes is None else [n * in_row for n in input_split_sizes],
            group,
            async_op,
        )

    # -- point to point: dtypes the library cannot move travel as bytes ------------------
    def send(
        self, tensor: torch.Tensor, dst: int, group: Group, async_op: bool = False, tag: int = 0
    ) -> Work | None:
        """send; dtypes the library cannot move travel as bytes."""
        return super().send(self._wire(tensor), dst, group, async_op, tag)

    def recv(
        self, tensor: torch.Tensor, src: int, group: Group, async_op: bool = False, tag: int = 0
    ) -> Work | None:
        """recv; dtypes the library cannot move travel as bytes."""
        return super().recv(self._wire(tensor), src, group, async_op, tag)

    def batch_isend_irecv(
        self, requests: Sequence[P2PRequest], group: Group, async_op: bool = False
    ) -> Work | None:
        """batch_isend_irecv; dtypes the library cannot move travel as bytes."""
        wired = [r._replace(tensor=self._wire(r.tensor)) for r in requests]
        return super().batch_isend_irecv(wired, group, async_op)

    def _wire(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self._wire_ok(tensor.dtype) else as_bytes(tensor)
