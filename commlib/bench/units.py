"""Byte sizes on the command line and in tables: ``"8M"`` <-> ``8388608``.

Sizes use powers of 1024, as nccl-tests does, so ``1K`` is 1024 bytes.
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: a number with an optional K/M/G/T suffix (powers of 1024).

    ``B`` / ``iB`` after the unit is accepted (``8MB``, ``8MiB``); fractions
    round down to whole bytes.

    Examples:
        >>> parse_size("1K"), parse_size("8M"), parse_size("1.5k"), parse_size(64)
        (1024, 8388608, 1536, 64)
    """
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE.match(text)
        if match is None:
            raise ValueError(f"not a size: {text!r} (expected e.g. 512, 1K, 8M, 1G)")
        value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value < 0:
        raise ValueError(f"a size cannot be negative: {text!r}")
    return value


def format_size(nbytes: int) -> str:
    """Shortest exact-ish label for ``nbytes``: ``1K``, ``1.5M``, ``100``.

    Examples:
        >>> format_size(1024), format_size(3 << 19), format_size(100)
        ('1K', '1.5M', '100')
    """
    for suffix in ("T", "G", "M", "K"):
        unit = _UNITS[suffix]
        if nbytes >= unit:
            value = nbytes / unit
            text = f"{value:.0f}" if value == int(value) else f"{value:.3g}"
            return text + suffix
    return str(nbytes)


def size_sweep(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """``min_bytes``, ``min_bytes * factor``, ... up to and including ``max_bytes``.

    Examples:
        >>> [format_size(s) for s in size_sweep(1024, 16 << 20, 4)]
        ['1K', '4K', '16K', '64K', '256K', '1M', '4M', '16M']
    """
    if min_bytes < 1:
        raise ValueError(f"--min-bytes must be at least 1, got {min_bytes}")
    if max_bytes < min_bytes:
        raise ValueError(f"--max-bytes ({max_bytes}) is below --min-bytes ({min_bytes})")
    if factor <= 1:
        raise ValueError(f"--factor must be above 1, got {factor}")
    sizes: list[int] = []
    size = float(min_bytes)
    while int(size) <= max_bytes:
        if not sizes or int(size) != sizes[-1]:
            sizes.append(int(size))
        size *= factor
    return sizes


def iterations_for(nbytes: int, iters: int, full_until: int = 1 << 20, floor: int = 3) -> int:
    """Timed iterations at ``nbytes``: ``iters`` up to ``full_until``, fewer above.

    Large sizes take long per call and vary little, so the count shrinks in
    proportion to the size (never below ``floor``, never above ``iters``); that
    keeps the default sweep short on a small machine.

    Examples:
        >>> iterations_for(1024, 20), iterations_for(4 << 20, 20), iterations_for(64 << 20, 20)
        (20, 5, 3)
    """
    if nbytes <= full_until:
        return iters
    return max(min(floor, iters), min(iters, iters * full_until // nbytes))
