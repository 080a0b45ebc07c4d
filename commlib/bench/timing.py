"""Timing one prepared case on this rank: commlib and torch, interleaved.

The timed calls are grouped into repeated *trials* (``--trials``), each of
``iters`` calls of each implementation, so a row can say how much its figures
move within one run (see :mod:`commlib.bench.stats`). The implementations are
the prepared case's calls: commlib and torch, and with ``--strict both``
commlib unchecked too (:data:`commlib.bench.cases.SIDES`). Fairness rules:

* the implementations take turns call by call within every trial, and which
  goes first rotates too, so drift in the machine (other load, CPU
  frequency, cache state) hits them alike, in every trial; each comes right
  after each of the others alike (:func:`order`): a call right after
  another engine's finds the caches cold;
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
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.distributed as dist

from commlib.bench.cases import IMPLS, Prepared
from commlib.bench.memory import peak_growth
from commlib.bench.stats import median
from commlib.types import Group


@dataclass
class Measurement:
    """This rank's times for one case at one size: seconds per timed call, by trial.

    ``times[impl][t]`` holds the seconds of each of ``impl``'s timed calls in
    trial ``t``.

    Examples:
        >>> Measurement().times
        {'commlib': [], 'torch': []}
    """

    times: dict[str, list[list[float]]] = field(default_factory=lambda: {i: [] for i in IMPLS})

    def impls(self) -> tuple[str, ...]:
        """The implementations measured, in the order they were prepared.

        Examples:
            >>> Measurement().impls()
            ('commlib', 'torch')
        """
        return tuple(self.times)

    def trial_medians(self, impl: str) -> list[float]:
        """Median seconds of ``impl``'s timed calls, one figure per trial.

        Examples:
            >>> m = Measurement(times={"commlib": [[1.0, 3.0, 2.0], [4.0, 5.0]], "torch": []})
            >>> m.trial_medians("commlib")
            [2.0, 4.5]
        """
        return [median(calls) for calls in self.times[impl]]

    def median(self, impl: str) -> float:
        """Median over the trials of ``impl``'s per-trial medians.

        Examples:
            >>> m = Measurement(times={"commlib": [[1.0], [3.0], [2.0]], "torch": []})
            >>> m.median("commlib")
            2.0
        """
        return median(self.trial_medians(impl))


def _call_then_sync(call: Callable[[], object], sync: Callable[[], None]) -> None:
    call()
    sync()


def _no_sync() -> None:
    """Nothing to wait for (CPU backends)."""


#: three sides' orders over six rounds: each goes first, in the middle and last twice,
#: and follows each other side three times, never itself (the rounds run on, so the
#: last of one round comes before the first of the next)
_THREE = ((0, 1, 2), (0, 2, 1), (2, 1, 0), (1, 0, 2), (1, 2, 0), (2, 0, 1))


def order(impls: tuple[str, ...], i: int) -> tuple[str, ...]:
    """Which implementation goes first in round ``i``: they take turns.

    Two alternate (the first, then the last first). Three take six orders
    in turn, so each goes first, in the middle and last alike, and each
    comes right after each of the others alike: a call's time depends on
    the one before it (a torch call on gloo leaves its threads busy and its
    ranks apart for the next call; an MPI call leaves them in step), and a
    plain rotation put the first side after the last one in two rounds of
    three, the second after it in one. More than three rotate.

    Examples:
        >>> order(("commlib", "torch"), 1)
        ('torch', 'commlib')
        >>> [order(("commlib", "unchecked", "torch"), i)[0] for i in range(6)]
        ['commlib', 'commlib', 'torch', 'unchecked', 'unchecked', 'torch']
    """
    if len(impls) == 2:
        return impls if i % 2 == 0 else impls[::-1]
    if len(impls) == 3:
        return tuple(impls[k] for k in _THREE[i % 6])
    k = i % len(impls)
    return impls[k:] + impls[:k]


def measure(
    prepared: Prepared,
    iters: int,
    warmup: int,
    group: Group = None,
    sync: Callable[[], None] = _no_sync,
    trials: int = 1,
) -> Measurement:
    """Warm up, check, then time ``trials`` trials of ``iters`` interleaved calls of each.

    Every rank of ``group`` must call it with the same arguments, as with any
    collective. At least one warm-up call is made: its result is checked. The
    alternation runs on across trials, so with an odd ``iters`` the trials
    start with commlib and with torch in turn.

    Examples:
        >>> from commlib.bench import cases
        >>> # every rank of an initialised process group:
        >>> prepared = cases.CASES[0].prepare(comm, 1 << 20)  # doctest: +SKIP
        >>> m = measure(prepared, iters=10, warmup=2, trials=5)  # doctest: +SKIP
        >>> m.trial_medians("commlib")              # doctest: +SKIP
        [0.00041, 0.00043, 0.0004, 0.00041, 0.00042]
    """
    calls = prepared.calls
    impls = tuple(calls)
    for i in range(max(1, warmup)):
        for impl in order(impls, i):
            result = calls[impl]()
            sync()
            if i == 0:
                prepared.check(result)
            del result
    out = Measurement(times={impl: [] for impl in impls})
    # a collection landing inside one timed call would bill it for garbage of
    # both; like timeit, time with the collector off and collect in between
    gc.disable()
    try:
        i = 0
        for _ in range(max(1, trials)):
            trial: dict[str, list[float]] = {impl: [] for impl in impls}
            for _ in range(iters):
                for impl in order(impls, i):
                    dist.barrier(group=group)
                    start = time.perf_counter()
                    calls[impl]()
                    sync()
                    trial[impl].append(time.perf_counter() - start)
                    gc.collect(0)
                i += 1
            for impl in impls:
                out.times[impl].append(trial[impl])
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
    for impl in prepared.calls:
        call = prepared.calls[impl]
        call()
        sync()
        dist.barrier(group=group)
        grown[impl], _ = peak_growth(functools.partial(_call_then_sync, call, sync))
    return grown
