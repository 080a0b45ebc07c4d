"""Bandwidth as nccl-tests reports it (``commlib bench`` and ``COMMLIB_STATS``): algbw and busbw.

``algbw`` is the bytes of the operation divided by its time. ``busbw`` scales
it by how much of that data each rank's link must carry in the best
algorithm, so it can be compared with the hardware's peak and across world
sizes. "Bytes of the operation" is the larger of the input and output buffers:
for all_gather the gathered output (world_size x each rank's part), for
reduce_scatter the full input.

Object collectives use the same definitions with the raw payload bytes (the
array or tensor inside the object, not the pickle): ``all_gather_object`` and
``gather_object`` count the gathered total like all_gather (the destination's
link carries ``(n-1)/n`` of it; gather has no better bound), and
``broadcast_object_list`` counts the broadcast payload like broadcast.
``all_reduce_params`` counts the total parameter bytes like all_reduce.

``reduce`` counts the reduced tensor (factor 1, as nccl-tests), ``gather``
the gathered total, ``scatter`` the whole scatter list and ``all_to_all`` /
``all_to_all_single`` the whole input (each ``(n-1)/n``, as nccl-tests'
gather, scatter and alltoall). The ``send_recv``
ping-pong counts the message twice, there and back, with factor 1.
"""

from __future__ import annotations

from collections.abc import Callable

from commlib import _catalog
from commlib._catalog import Busbw


# a world of one moves nothing: its busbw is 0, as in nccl-tests
def _all_reduce(n: int) -> float:
    return 2 * (n - 1) / n


def _gather_like(n: int) -> float:
    return (n - 1) / n


def _broadcast(n: int) -> float:
    return 1.0


# how the factor is written in tables and the docs
FACTOR_TEXT: dict[Callable[[int], float], str] = {
    _all_reduce: "2(n-1)/n",
    _gather_like: "(n-1)/n",
    _broadcast: "1",
}
_FACTOR_OF = {text: factor for factor, text in FACTOR_TEXT.items()}

# commlib bench's composite cases, counted like the collective they are made of
_BENCH_CASES: dict[str, Busbw] = {"all_reduce_params": "2(n-1)/n", "send_recv": "1"}

# collective name -> busbw factor for a world of n ranks (each collective's own in
# the catalog)
BUSBW_FACTORS: dict[str, Callable[[int], float]] = {
    name: _FACTOR_OF[text] for name, text in {**_catalog.BUSBW, **_BENCH_CASES}.items()
}


def busbw_factor(op: str, world_size: int) -> float:
    """The factor that turns ``op``'s algbw into busbw for ``world_size`` ranks.

    Examples:
        >>> busbw_factor("all_reduce", 4), busbw_factor("all_gather", 4)
        (1.5, 0.75)
        >>> busbw_factor("broadcast", 8)
        1.0
    """
    try:
        return BUSBW_FACTORS[op](world_size)
    except KeyError:
        raise ValueError(f"no bus bandwidth factor for {op!r}") from None


def factor_text(op: str) -> str:
    """The busbw factor of ``op`` as a formula, e.g. ``"2(n-1)/n"``.

    Examples:
        >>> factor_text("reduce_scatter")
        '(n-1)/n'
    """
    return FACTOR_TEXT[BUSBW_FACTORS[op]]


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (10**9 bytes per second, as nccl-tests).

    Examples:
        >>> algbw(2_000_000_000, 2.0)
        1.0
    """
    return nbytes / seconds / 1e9 if seconds > 0 else float("nan")


def busbw(op: str, nbytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in GB/s: :func:`algbw` times :func:`busbw_factor`.

    Examples:
        >>> busbw("all_reduce", 2_000_000_000, 1.0, 2)
        2.0
    """
    return algbw(nbytes, seconds) * busbw_factor(op, world_size)
