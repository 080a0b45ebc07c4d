"""The conformance checks, one registry; each check runs on every rank of a world.

A check is a module-level function ``fn(comm, ctx)`` that raises
``AssertionError`` (or any exception) when the backend breaks the contract.
``ctx`` is a dict the runner sends along (a shared temporary directory, the
world size it expects, ...). Register one with :func:`check`; the kit's own
live in the modules of this package.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Check:
    """One entry of the contract: a name, the function every rank runs, where it applies."""

    name: str
    fn: Callable[[Any, dict], None]
    min_world: int = 1
    max_world: int | None = None
    doc: str = ""

    def applies(self, world_size: int) -> bool:
        return world_size >= self.min_world and (
            self.max_world is None or world_size <= self.max_world
        )


CHECKS: dict[str, Check] = {}


def check(
    name: str, *, min_world: int = 1, max_world: int | None = None
) -> Callable[[Callable[[Any, dict], None]], Callable[[Any, dict], None]]:
    """Register a module-level ``fn(comm, ctx)`` as conformance check ``name``.

    Examples:
        >>> @check("my_backend_extra", min_world=2)
        ... def _extra(comm, ctx):
        ...     expect(comm.world_size >= 2, "needs peers")
        >>> CHECKS["my_backend_extra"].applies(1)
        False
        >>> del CHECKS["my_backend_extra"]      # a doctest leaves the registry as it was
    """

    def register(fn: Callable[[Any, dict], None]) -> Callable[[Any, dict], None]:
        if name in CHECKS and CHECKS[name].fn is not fn:
            raise ValueError(f"a conformance check named {name!r} exists already")
        doc = (fn.__doc__ or "").strip().splitlines()
        CHECKS[name] = Check(name, fn, min_world, max_world, doc[0] if doc else "")
        return fn

    return register


# -- assertions ---------------------------------------------------------------------------
def expect(condition: Any, message: str) -> None:
    """Fail the check with ``message`` unless ``condition`` holds.

    Examples:
        >>> expect(comm.rank < comm.world_size, "rank out of range")
    """
    if not condition:
        raise AssertionError(message)


def expect_tensor(
    actual: Any,
    expected: torch.Tensor,
    what: str,
    device: torch.device | None = None,
    close: bool = False,
) -> None:
    """``actual`` is a tensor with ``expected``'s dtype, shape and values, on ``device``.

    ``device`` defaults to ``expected``'s; ``close`` allows float rounding.

    Examples:
        >>> out = torch.tensor([1.0])
        >>> comm.all_reduce(out)
        >>> expect_tensor(out, torch.tensor([float(comm.world_size)]), "all_reduce sum")
    """
    expect(isinstance(actual, torch.Tensor), f"{what}: got {type(actual).__name__}, not a tensor")
    want = expected.device if device is None else device
    expect(actual.device == want, f"{what}: result on {actual.device}, expected {want}")
    expect(actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}")
    expect(
        actual.shape == expected.shape,
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}",
    )
    got, want_values = actual.detach().cpu(), expected.detach().cpu()
    if close and (got.is_floating_point() or got.is_complex()):
        # means may round differently in low precision (native averages, order)
        wide = torch.complex128 if got.is_complex() else torch.float64
        ok = torch.allclose(got.to(wide), want_values.to(wide), rtol=1e-2, atol=1e-2)
    else:
        ok = torch.equal(got, want_values)
    expect(ok, f"{what}: values {got.tolist()} != expected {want_values.tolist()}")


def expect_raises(
    kinds: type[BaseException] | tuple[type[BaseException], ...],
    fn: Callable[..., Any],
    *args: Any,
    match: str | None = None,
    **kwargs: Any,
) -> BaseException:
    """Call ``fn`` and require it to raise one of ``kinds`` (message matching ``match``).

    Examples:
        >>> expect_raises(ValueError, comm.all_reduce, torch.ones(1), op="nope")
        ValueError("unknown reduce op 'nope'; expected one of sum, mean, ...")
    """
    try:
        fn(*args, **kwargs)
    except kinds as exc:
        if match is not None and not re.search(match, str(exc)):
            raise AssertionError(
                f"{_name(fn)} raised {type(exc).__name__}({exc}) not matching {match!r}"
            ) from exc
        return exc
    except Exception as exc:
        raise AssertionError(
            f"{_name(fn)} raised {type(exc).__name__}({exc}), expected {_kinds(kinds)}"
        ) from exc
    raise AssertionError(f"{_name(fn)} did not raise {_kinds(kinds)}")


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", repr(fn))


def _kinds(kinds: Any) -> str:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(k.__name__ for k in kinds)


# -- data ---------------------------------------------------------------------------------
def devices(comm: Any) -> list[torch.device]:
    """Where callers' tensors may live: the CPU and the backend's device.

    Examples:
        >>> devices(comm)            # single, gloo
        [device(type='cpu')]
        >>> devices(comm)            # on nccl  # doctest: +SKIP
        [device(type='cpu'), device(type='cuda', index=0)]
    """
    out = [torch.device("cpu")]
    if comm.device.type != "cpu":
        out.append(comm.device)
    return out


def rank_tensor(
    rank: int, dtype: torch.dtype, shape: Sequence[int] = (2, 3), device: Any = "cpu"
) -> torch.Tensor:
    """Small rank-dependent values, exact in every dtype (products stay within int8).

    Examples:
        >>> rank_tensor(1, torch.int64, (4,))
        tensor([2, 3, 4, 2])
    """
    base = torch.arange(int(torch.tensor(shape).prod()) if len(shape) else 1).reshape(shape)
    if dtype == torch.bool:
        values = (base + rank) % 2 == 0
        return values.to(device)
    return (base % 3 + rank + 1).to(dtype).to(device)


_ORACLE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add,
    "product": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}


def oracle(parts: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """What reducing ``parts`` with ``op`` must give (sum of bools is logical or).

    Examples:
        >>> oracle([torch.tensor([1]), torch.tensor([2])], "sum")
        tensor([3])
    """
    if op == "mean":
        total = functools.reduce(torch.add, parts)
        if total.is_floating_point() or total.is_complex():
            return total / len(parts)
        return torch.true_divide(total, len(parts)).to(total.dtype)
    return functools.reduce(_ORACLE[op], parts)


def every_rank(comm: Any, dtype: torch.dtype, shape: Sequence[int] = (2, 3)) -> list:
    """:func:`rank_tensor` of every rank of ``comm``, on the CPU.

    Examples:
        >>> oracle(every_rank(comm, torch.float32), "max")   # a world of one
        tensor([[1., 2., 3.],
                [1., 2., 3.]])
    """
    return [rank_tensor(r, dtype, shape) for r in range(comm.world_size)]
