"""Argument checks shared by the collectives; each raises before anything is sent."""

from __future__ import annotations

from typing import Any

import torch

REDUCE_OPS = ("sum", "mean", "product", "min", "max", "band", "bor", "bxor")
_BITWISE = ("band", "bor", "bxor")


def reduce_op(op: Any, tensor: torch.Tensor | None = None) -> str:
    """Normalise a reduce-op name (case-insensitive), checking it fits ``tensor``.

    ``torch.distributed.ReduceOp`` members are accepted too, for code that
    passes them as mmengine allows.

    Examples:
        >>> reduce_op("MEAN")
        'mean'
        >>> reduce_op("avg")
        Traceback (most recent call last):
        ValueError: unknown reduce op 'avg'; expected one of sum, mean, ...
    """
    name = op
    if not isinstance(op, str):
        # ReduceOp / RedOpType: "RedOpType.SUM" or "ReduceOp.SUM"
        text = str(getattr(op, "name", op)).rsplit(".", 1)[-1].lower()
        name = "mean" if text == "avg" else text
        if name not in REDUCE_OPS:
            raise TypeError(f"op must be a string such as 'sum' or 'mean', got {op!r}")
    name = name.lower()
    if name not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r}; expected one of {', '.join(REDUCE_OPS)}")
    if (
        tensor is not None
        and name in _BITWISE
        and (tensor.is_floating_point() or tensor.is_complex())
    ):
        raise TypeError(f"op {name!r} needs an integer or bool tensor, got {tensor.dtype}")
    return name


def tensor(value: Any, what: str = "data") -> torch.Tensor:
    """Check that ``value`` is a tensor.

    Examples:
        >>> tensor([1, 2])
        Traceback (most recent call last):
        TypeError: data must be a torch.Tensor, got list
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(value).__name__}")
    return value


def rank_in_range(value: Any, world_size: int, what: str) -> int:
    """Check that ``value`` is a rank of a group of ``world_size``.

    Examples:
        >>> rank_in_range(2, 2, "dst")
        Traceback (most recent call last):
        ValueError: dst=2 is out of range for a group of 2 ranks (0..1)
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int rank, got {type(value).__name__}")
    if not 0 <= value < world_size:
        raise ValueError(
            f"{what}={value} is out of range for a group of {world_size} ranks "
            f"(0..{world_size - 1})"
        )
    return value
