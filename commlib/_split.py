"""Who goes with whom in ``Communicator.split``: MPI_Comm_split's rule, on a table of every rank.

Every rank contributes ``(color, key)``; ranks of one color form a group,
ordered by ``key`` and, for equal keys, by their rank in the parent. A rank
whose color is ``None`` joins no group (MPI's ``MPI_UNDEFINED``).
"""

from __future__ import annotations

import numbers
from typing import Any


def checked(color: Any, key: Any, rank: int) -> tuple[int | None, int]:
    """``color`` and ``key`` as ints (``key`` defaults to ``rank``); a clear error otherwise.

    Examples:
        >>> checked(1, None, 3)
        (1, 3)
        >>> checked(-1, 0, 0)
        Traceback (most recent call last):
        ValueError: split's color must be an int >= 0 or None (no group), got -1
    """
    if color is not None:
        if isinstance(color, bool) or not isinstance(color, numbers.Integral) or color < 0:
            raise ValueError(
                f"split's color must be an int >= 0 or None (no group), got {color!r}"
            )
        color = int(color)
    if key is None:
        key = rank
    elif isinstance(key, bool) or not isinstance(key, numbers.Integral):
        raise TypeError(f"split's key must be an int or None, got {key!r}")
    return color, int(key)


def members(table: list[tuple[int | None, int]], color: int | None) -> list[int]:
    """The parent ranks of ``color``'s group, in their new order (by key, then parent rank).

    Examples:
        >>> members([(0, 5), (1, 0), (0, 1), (1, 0)], 0)
        [2, 0]
        >>> members([(0, 5), (1, 0), (0, 1), (1, 0)], 1)
        [1, 3]
    """
    if color is None:
        return []
    return sorted(
        (r for r, (c, _) in enumerate(table) if c == color), key=lambda r: (table[r][1], r)
    )
