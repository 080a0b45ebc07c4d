"""Timing one prepared case on this rank: commlib and torch, interleaved.

Fairness rules:

* the two implementations alternate call by call, and which goes first
  alternates too, so drift in the machine (other load, CPU frequency, cache
  state) hits both alike;
* every timed call starts right after a barrier, so a rank that is late from
  the previous call does not bill its lateness to the next one;
* device work is waited for before the clock stops (accelerator backends);
* the first warm-up call of each implementation is checked for a correct
  result, so a broken case cannot post a good number.

Peak memory is measured by :func:`probe_memory` in a separate pass after all
timing (see :mod:`commlib.bench.memory`), so neither disturbs the other.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.distributed as dist

from commlib.bench.cases import IMPLS, Prepared
from commlib.bench.memory import peak_growth
from commlib.types import Group


@dataclass
class Measurement:
    """This rank's times for one case at one size: seconds per timed call, by implementation.

    Examples:
        >>> Measurement().times
        {'commlib': [], 'torch': []}
    """

    times: dict[str, list[float]] = field(default_factory=lambda: {i: [] for i in IMPLS})

    def median(self, impl: str) -> float:
        """Median seconds of ``impl``'s timed calls.

        Examples:
            >>> Measurement(times={"commlib": [1.0, 3.0, 2.0], "torch": []}).median("commlib")
            2.0
        """
        return statistics.median(self.times[impl])


def _call_then_sync(call: Callable[[], object], sync: Callable[[], None]) -> None:
    call()
    sync()


def _no_sync() -> None:
    """Nothing to wait for (CPU backends)."""


def _order(i: int) -> tuple[str, ...]:
    return IMPLS if i % 2 == 0 else IMPLS[::-1]


def measure(
    prepared: Prepared,
    iters: int,
    warmup: int,
    group: Group = None,
    sync: Callable[[], None] = _no_sync,
) -> Measurement:
    """Warm up, check, then time ``iters`` interleaved calls of each implementation.

    Every rank of ``group`` must call it with the same arguments, as with any
    collective. At least one warm-up call is made: its result is checked.

    Examples:
        >>> from commlib.bench import cases
        >>> # every rank of an initialised process group:
        >>> prepared = cases.CASES[0].prepare(comm, 1 << 20)  # doctest: +SKIP
        >>> m = measure(prepared, iters=10, warmup=2)       # doctest: +SKIP
        >>> m.median("commlib"), m.median("torch")  # doctest: +SKIP
        (0.00041, 0.0004)
    """
    calls = prepared.calls
    for i in range(max(1, warmup)):
        for impl in _order(i):
            result = calls[impl]()
            sync()
            if i == 0:
                prepared.check(result)
            del result
    out = Measurement()
    # a collection landing inside one timed call would bill it for garbage of
    # both; like timeit, time with the collector off and collect in between
    gc.disable()
    try:
        for i in range(iters):
            for impl in _order(i):
                dist.barrier(group=group)
                start = time.perf_counter()
                calls[impl]()
                sync()
                out.times[impl].append(time.perf_counter() - start)
                gc.collect(0)
    finally:
        gc.enable()
    return out


def probe_memory(
    prepared: Prepared, group: Group = None, sync: Callable[[], None] = _no_sync
) -> dict[str, int]:
    """Peak RSS growth in bytes of one steady-state call of each implementation.

    One untimed call first, so one-time setup (connections, caches a
    library keeps for the next call) is not counted. Every rank of
    ``group`` must call it.

    Examples:
        >>> from commlib.bench import cases
        >>> probe_memory(cases.CASES[0].prepare(comm, 16 << 20))  # every rank  # doctest: +SKIP
        {'commlib': 0, 'torch': 0}
    """
    grown = {}
    for impl in IMPLS:
        call = prepared.calls[impl]
        call()
        sync()
        dist.barrier(group=group)
        grown[impl], _ = peak_growth(functools.partial(_call_then_sync, call, sync))
    return grown
