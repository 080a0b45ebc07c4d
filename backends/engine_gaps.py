"""What an engine lacks, supplied: dtypes it cannot move, reductions it cannot do.

A backend states what its library handles (``wire_dtypes``, ``reduce_dtypes``,
``reduce_ops``, ``native_gather``); :class:`EngineGaps` sends the rest as raw
bytes, or as an all_gather followed by a reduction on this rank, in rank order.
gloo and the accelerator backends share it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from commlib.backend import Backend
from commlib.dtypes import byte_view
from commlib.reductions import reduce_locally
from commlib.types import EngineOp, Group, Work

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


class EngineGaps(Backend):
    """Backend defaults that route around what the engine cannot do.

    Class attributes a subclass sets:

    * ``wire_dtypes``: dtypes the engine moves (others travel as bytes);
    * ``reduce_dtypes`` / ``reduce_ops``: what it reduces itself (others are
      gathered and reduced here, in rank order, so every rank gets the same bits);
    * ``native_gather``: whether it has ``gather`` (else an all_gather kept on dst).
    """

    reduce_ops: ClassVar[frozenset[str]] = frozenset(
        {"sum", "product", "min", "max", "band", "bor", "bxor"}
    )
    reduce_dtypes: ClassVar[frozenset[torch.dtype]] = frozenset()
    wire_dtypes: ClassVar[frozenset[torch.dtype]] = frozenset()
    native_gather: ClassVar[bool] = True

    # -- what the library handles itself ---------------------------------------------
    def _wire_ok(self, dtype: torch.dtype) -> bool:
        return _REAL_OF_COMPLEX.get(dtype, dtype) in self.wire_dtypes

    def reduces_natively(self, op: str, dtype: torch.dtype) -> bool:
        """Whether the library reduces ``dtype`` with ``op`` (an engine op name).

        Examples:
            >>> commlib.plugins.get_backend_plugin("nccl").reduces_natively("band", torch.int64)
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

    # -- tensor collectives ------------------------------------------------------------
    # The supplied paths (local reductions, gather by all_gather) complete before
    # they return, so they return None: a finished call, as the contract allows.
    def all_reduce(
        self, tensor: torch.Tensor, op: EngineOp, group: Group, async_op: bool = False
    ) -> Work | None:
        """The library's all_reduce, or an all_gather and a local reduction in rank order."""
        if self.reduces_natively(op, tensor.dtype):
            return super().all_reduce(tensor, op, group, async_op)
        parts = [torch.empty_like(tensor) for _ in range(self.world_size(group))]
        self.all_gather(parts, tensor, group)
        tensor.copy_(reduce_locally(parts, op))
        return None

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: EngineOp,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """The library's reduce_scatter, or a supplied all_reduce keeping this rank's chunk."""
        if self.reduces_natively(op, input.dtype):
            return super().reduce_scatter(output, input, op, group, async_op)
        whole = input.clone()
        self.all_reduce(whole, op, group)
        output.copy_(whole.view(self.world_size(group), -1)[self.rank(group)].view_as(output))
        return None

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        group: Any,
        async_op: bool = False,
    ) -> Any:
        """all_gather; dtypes the library cannot move travel as bytes."""
        if self._wire_ok(tensor.dtype):
            return super().all_gather(tensor_list, tensor, group, async_op)
        raw = [as_bytes(t) for t in tensor_list]
        return super().all_gather(raw, as_bytes(tensor), group, async_op)

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, group: Any, async_op: bool = False
    ) -> Any:
        """all_gather_into_tensor; dtypes the library cannot move travel as bytes."""
        if self._wire_ok(tensor.dtype):
            return super().all_gather_into_tensor(output, tensor, group, async_op)
        return super().all_gather_into_tensor(as_bytes(output), as_bytes(tensor), group, async_op)

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
        """The library's gather, or an all_gather whose result only ``dst`` keeps."""
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
