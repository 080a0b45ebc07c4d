"""Reductions computed on this rank, and how a collective's result reaches the caller's tensor.

Where data from every rank is already here (gathered), commlib reduces it in
rank order itself, exact for every dtype, the same bits on every rank: the
backends for the reductions and dtypes their engine lacks
(:mod:`commlib_backends.engine_gaps`), and the communicator for small tensors
that travelled with their argument check (:mod:`commlib._guard`).

The write-back (:func:`reduction`, :func:`copy_back`, :func:`divide_back`)
is the communicator's last step: ``mean`` by sum-and-divide where the engine
has no average, and the result written into the caller's tensor as
torch.distributed writes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from commlib._host_copy import PARALLEL_FROM
from commlib.handle import Handle
from commlib.types import EngineOp

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

# A large reduction runs on the calling thread, as an engine's does, and as
# commlib._host_copy's copies: torch splits one of more than its grain size
# across its intra-op threads, which wait on each other for milliseconds where
# ranks share the cores (a 4 MB float32 sum of two rows: 13-34 ms on 2 busy
# cores, 0.6 ms on one thread). numpy's elementwise loops stay on this thread
# and give the same bits (one IEEE operation per element, in rank order).
_INTEGERS = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
_REALS = _INTEGERS | {torch.float32, torch.float64}
_NUMPY_OPS: dict[str, tuple[Callable[..., Any], frozenset[torch.dtype]]] = {
    "sum": (np.add, _REALS),
    "product": (np.multiply, _REALS),
    # (floats stay on torch: its min/max of two NaNs is another NaN's bits)
    "min": (np.minimum, _INTEGERS),
    "max": (np.maximum, _INTEGERS),
    "band": (np.bitwise_and, _INTEGERS),
    "bor": (np.bitwise_or, _INTEGERS),
    "bxor": (np.bitwise_xor, _INTEGERS),
}


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
    if out.numel() >= PARALLEL_FROM and _on_this_thread(out, parts, op):
        return
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


def _on_this_thread(out: torch.Tensor, parts: Sequence[torch.Tensor], op: str) -> bool:
    # reduce_into's reduction with numpy's loops, where they give torch's bits
    found = _NUMPY_OPS.get(op)
    if found is None or len(parts) < 2 or out.dtype not in found[1]:
        return False
    every = (out, *parts)
    if any(t.dtype != out.dtype or not t.is_cpu or t.requires_grad for t in every):
        return False
    ufunc, mine = found[0], out.numpy()
    ufunc(parts[0].numpy(), parts[1].numpy(), out=mine)
    for part in parts[2:]:
        ufunc(mine, part.numpy(), out=mine)
    return True


def reduction(
    op: str, tensor: torch.Tensor, native_avg: bool
) -> tuple[EngineOp, Callable[[torch.Tensor, torch.Tensor, int], None]]:
    """What the engine reduces with, and how the result reaches the caller's tensor.

    ``mean`` is the engine's ``avg`` where it averages floating (and complex)
    tensors natively; otherwise a ``sum`` that commlib divides, in floating
    point, writing an integer tensor back truncated, as mmengine does.

    Examples:
        >>> engine_op, back = reduction("mean", torch.tensor([3, 4]), native_avg=True)
        >>> engine_op
        'sum'
        >>> target = torch.tensor([3, 4])
        >>> back(torch.tensor([6, 9]), target, 2)   # the sum over 2 ranks
        >>> target
        tensor([3, 4])
    """
    if op != "mean":
        return op, copy_back  # type: ignore[return-value]
    if native_avg and (tensor.is_floating_point() or tensor.is_complex()):
        return "avg", copy_back
    return "sum", divide_back


def copy_back(result: torch.Tensor, target: torch.Tensor, world: int) -> None:
    """Write ``result`` into ``target`` unless it is ``target``'s own memory already.

    Examples:
        >>> target = torch.zeros(2)
        >>> copy_back(torch.ones(2), target, 1)
        >>> target
        tensor([1., 1.])
    """
    if result is target:
        return
    if result.data_ptr() != target.data_ptr() or result.device != target.device:
        write(target, result.view(target.shape))


def divide_back(result: torch.Tensor, target: torch.Tensor, world: int) -> None:
    """Write the sum ``result`` divided by ``world`` into ``target``: ``mean`` done by commlib.

    Examples:
        >>> target = torch.zeros(2)
        >>> divide_back(torch.tensor([2.0, 4.0]), target, 2)
        >>> target
        tensor([1., 2.])
    """
    if result.is_floating_point() and result.element_size() == 1:
        # float8 has no division of its own: in float32, rounded back once
        write(target, (result.float() / world).to(result.dtype).view(target.shape))
    elif result.is_floating_point() or result.is_complex():
        result.div_(world)
        copy_back(result, target, world)
    else:
        write(target, torch.true_divide(result, world).view(target.shape))


def write(target: torch.Tensor, value: torch.Tensor) -> None:
    """``target.copy_(value)`` as torch.distributed writes: outside autograd, and once
    per memory location of an expanded tensor (whose aliased elements agree).

    Examples:
        >>> target = torch.zeros(1).expand(3)
        >>> write(target, torch.ones(3))
        >>> target
        tensor([1., 1., 1.])
    """
    if target.requires_grad:
        target = target.detach()
    if not target.is_contiguous() and 0 in target.stride():
        for dim, (size, step) in enumerate(zip(target.shape, target.stride())):
            if step == 0 and size > 1:
                target, value = target.narrow(dim, 0, 1), value.narrow(dim, 0, 1)
    target.copy_(value)


def write_back(
    back: Callable[[torch.Tensor, torch.Tensor, int], None],
    result: torch.Tensor,
    target: torch.Tensor,
    world: int,
    async_op: bool,
) -> Handle | None:
    """``back(result, target, world)`` now, or in the returned handle's ``wait()``.

    The end of a collective that completed within its argument check: no
    engine work is pending, so a blocking call writes its result back at once.

    Examples:
        >>> target = torch.zeros(2)
        >>> write_back(copy_back, torch.ones(2), target, 1, False)
        >>> target
        tensor([1., 1.])
        >>> write_back(copy_back, torch.ones(2), target, 1, True).wait()
        True
    """
    if async_op:
        return Handle(None, lambda: back(result, target, world), None, value=[target])
    back(result, target, world)
    return None
