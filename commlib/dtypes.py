"""A stable numbering of torch dtypes, so ranks can compare dtypes as integers."""

from __future__ import annotations

import torch

_DTYPES: list[torch.dtype] = sorted(
    {v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str
)
_CODES = {d: i for i, d in enumerate(_DTYPES)}


def dtype_code(dtype: torch.dtype) -> int:
    """An int naming ``dtype``, the same on every rank running the same torch.

    Examples:
        >>> dtype_from_code(dtype_code(torch.bfloat16))
        torch.bfloat16
    """
    return _CODES[dtype]


def dtype_from_code(code: int) -> torch.dtype | str:
    """The dtype :func:`dtype_code` numbered ``code`` (a string when unknown)."""
    return _DTYPES[code] if 0 <= code < len(_DTYPES) else f"unknown dtype #{code}"


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """A flat ``uint8`` view of a contiguous tensor's memory (writes land in ``tensor``).

    ``reshape(-1).view(torch.uint8)`` is not enough: a tensor whose size-1 dims
    carry any stride counts as contiguous, yet ``view`` refuses it.

    Examples:
        >>> byte_view(torch.zeros(4, dtype=torch.bfloat16)[::2][:1]).shape
        torch.Size([2])
    """
    if not tensor.is_contiguous():
        raise ValueError("byte_view needs a contiguous tensor")
    if tensor.dtype == torch.uint8 and tensor.dim() == 1:
        return tensor  # already what is asked for: no view ops on hot paths
    if tensor.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=tensor.device)
    return tensor.as_strided((tensor.numel(),), (1,)).view(torch.uint8)
