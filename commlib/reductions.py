"""Reductions computed on this rank, exact for every dtype, the same bits on every rank.

Where data from every rank is already here (gathered), commlib reduces it in
rank order itself: the backends for the reductions and dtypes their engine
lacks (:mod:`commlib_backends.engine_gaps`), and the communicator for small
tensors that travelled with their argument check (:mod:`commlib._guard`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

# the reductions commlib needs, computed locally on gathered tensors; torch.add
# and torch.mul on bool are logical or / and, as gloo does them
_LOCAL_REDUCE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add,
    "product": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}

# torch cannot add or compare these on the CPU: reduce in a wider dtype, then
# narrow back (integer narrowing wraps, as the sum would have)
_WIDER = {
    torch.uint16: torch.int32,
    torch.uint32: torch.int64,
    **{
        d: torch.float32
        for d in (
            getattr(torch, n, None)
            for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
        )
        if d is not None
    },
}
_SIGN64 = -(2**63)


def reduce_locally(parts: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """Reduce equally shaped tensors with one of commlib's engine op names.

    Dtypes torch cannot reduce on the CPU are reduced exactly in a wider one;
    uint64 as int64 bits (min/max with the sign bit flipped).

    Examples:
        >>> reduce_locally([torch.tensor([1, 2]), torch.tensor([3, 4])], "max")
        tensor([3, 4])
    """
    dtype = parts[0].dtype
    if dtype == torch.uint64:
        bits = [p.view(torch.int64) for p in parts]
        if op in ("min", "max"):
            flipped = [b ^ _SIGN64 for b in bits]
            return (functools.reduce(_LOCAL_REDUCE[op], flipped) ^ _SIGN64).view(torch.uint64)
        return reduce_locally(bits, op).view(torch.uint64)
    if dtype in _WIDER:
        return reduce_locally([p.to(_WIDER[dtype]) for p in parts], op).to(dtype)
    if op == "avg":
        return functools.reduce(torch.add, parts) / len(parts)
    return functools.reduce(_LOCAL_REDUCE[op], parts)


def reduce_into(out: torch.Tensor, parts: Sequence[torch.Tensor], op: str) -> None:
    """:func:`reduce_locally`, written into ``out`` (shaped and typed like each part).

    The same bits, in the same rank order, without the temporary and the copy
    where torch can write the reduction into ``out`` itself (a small
    collective's host work counts double on a busy CPU).

    Examples:
        >>> out = torch.empty(2, dtype=torch.int64)
        >>> reduce_into(out, [torch.tensor([1, 2]), torch.tensor([3, 4])], "sum")
        >>> out
        tensor([4, 6])
    """
    reduce = _LOCAL_REDUCE.get(op)
    dtype = parts[0].dtype
    if (
        reduce is None
        or len(parts) < 2
        or out.dtype != dtype
        or dtype in _WIDER
        or dtype == torch.uint64
    ):
        out.copy_(reduce_locally(parts, op))
        return
    reduce(parts[0], parts[1], out=out)  # type: ignore[call-arg]
    for part in parts[2:]:
        reduce(out, part, out=out)  # type: ignore[call-arg]
