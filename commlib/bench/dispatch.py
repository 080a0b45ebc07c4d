"""The dispatch kind: what a call costs on its way to the engine, commlib against torch.

``commlib bench --ops dispatch`` runs in its own process, with no ranks to
start: a world of ``--nproc`` on torch's fake process group
(:mod:`commlib.bench.fake_world`), whose collectives send nothing, so a
call's time is the work between the caller and the engine. Per collective
(:mod:`commlib.bench.dispatch_cases`) it times four *sides*:

* ``torch``: torch's own call (``torch.distributed.all_reduce(t, group=pg)``);
* ``unchecked``: commlib's :class:`~commlib.Communicator` method, ``strict=False``;
* ``observer``: the same with one observer plugin registered (both hooks,
  doing nothing: :class:`NoOpObserver`), what any observer costs at least;
* ``recorder``: the same with the flight recorder registered
  (:class:`~commlib.observe.FlightRecorder`, in memory).

A trial times ``calls`` calls of each side in a row (the observer and the
recorder are registered for their block only), the sides in an order that
rotates from trial to trial, so drift in a shared machine hits them alike;
the garbage collector is off inside a block. A side's figure for a trial is
its block's time per call; a row has the median over the trials and, for
each commlib side, the ratio to torch with its spread over the trials
(:mod:`commlib.bench.stats`).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from commlib import plugins
from commlib.backend import Backend
from commlib.bench import stats
from commlib.bench.dispatch_cases import ELEMENTS, KIND, VARIANTS, DispatchCase, select_dispatch
from commlib.bench.fake_world import FAKE, dispatch_plugin, fake_world
from commlib.bench.named_plugin import simulated_if_absent
from commlib.bench.options import BenchOptions, backend_plugin
from commlib.bench.progress import Progress
from commlib.communicator import Communicator
from commlib.hookspecs import hookimpl
from commlib.observe import FlightRecorder
from commlib.observe.event import CollectiveEvent

Row = dict[str, Any]

SIDES = ("torch", *VARIANTS)


class NoOpObserver:
    """An observer plugin with both hooks, doing nothing: what observing costs at least.

    Examples:
        >>> pm = commlib.plugins.plugin_manager()
        >>> name = pm.register(NoOpObserver())
        >>> comm.all_reduce(torch.ones(2))
        >>> _ = pm.unregister(name=name)
    """

    @hookimpl
    def commlib_collective_start(self, event: CollectiveEvent) -> None:
        """Nothing."""

    @hookimpl
    def commlib_collective_end(self, event: CollectiveEvent) -> None:
        """Nothing."""


class _Sides:
    """The observers the sides register, made once for the run."""

    def __init__(self) -> None:
        self.pm = plugins.plugin_manager()
        self.observer = NoOpObserver()
        # one recorder for the whole run: its ring fills once and stays full, as in a job
        self.recorder = FlightRecorder()

    @contextlib.contextmanager
    def on(self, side: str) -> Iterator[None]:
        """``side``'s observer registered for the block (none for torch and unchecked)."""
        plugin = {"observer": self.observer, "recorder": self.recorder}.get(side)
        if plugin is None:
            yield
            return
        self.pm.register(plugin)
        try:
            yield
        finally:
            self.pm.unregister(plugin)


def _per_call(call: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``calls`` calls in a row, the collector off."""
    gc.collect(0)
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for _ in range(calls):
            call()
        return (time.perf_counter_ns() - start) / calls / 1e9
    finally:
        gc.enable()


def _order(trial: int) -> tuple[str, ...]:
    k = trial % len(SIDES)
    return SIDES[k:] + SIDES[:k]


def measure(
    comm: Communicator, case: DispatchCase, calls: int, trials: int, warmup: int, sides: _Sides
) -> dict[str, list[float]]:
    """Seconds per call of each side, one figure per trial.

    Each side first makes ``warmup`` untimed calls (at least one: a broken
    case fails here), and one more before each timed block (the first call
    after a registration change looks the observers up).

    Examples:
        >>> from commlib.bench.dispatch_cases import CASES
        >>> with fake_world(2, plugin) as comm:  # doctest: +SKIP
        ...     measure(comm, CASES[0], calls=1000, trials=5, warmup=3, sides=_Sides())
        {'torch': [4.1e-06, ...], 'unchecked': [...], 'observer': [...], 'recorder': [...]}
    """
    prepared = case.prepare(comm)
    call_of = {side: prepared["torch" if side == "torch" else "commlib"] for side in SIDES}
    for side in SIDES:
        with sides.on(side):
            for _ in range(max(1, warmup)):
                call_of[side]()
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for trial in range(max(1, trials)):
        for side in _order(trial):
            with sides.on(side):
                call_of[side]()
                times[side].append(_per_call(call_of[side], calls))
    return times


def run_dispatch(opts: BenchOptions) -> list[Row]:
    """Time the dispatch cases ``opts.ops`` names, in this process; their rows.

    ``opts.nproc`` is the fake world's size, ``opts.backend`` the plugin
    whose call path is timed (this machine's default when unset; an absent
    accelerator over simulated devices, see :mod:`commlib.bench.named_plugin`),
    ``opts.calls`` the calls of each side per trial. torch.distributed must
    not be initialised in this process.

    Examples:
        >>> rows = run_dispatch(BenchOptions(ops="all_reduce[dispatch]", trials=3))
        ... # doctest: +SKIP
        >>> rows[0]["case"], rows[0]["unchecked_ratio"]  # doctest: +SKIP
        ('all_reduce', 2.3)
    """
    named = backend_plugin(opts.backend, dispatch=True)
    base = simulated_if_absent(named)
    plugin = dispatch_plugin(base)
    cases = [c for c in select_dispatch(opts.ops) if opts.nproc >= c.min_world]
    before = plugins.list_observers()  # COMMLIB_TRACE_DIR, COMMLIB_STATS, installed ones
    sides = _Sides()
    rows = []
    with fake_world(opts.nproc, plugin) as comm:
        bar = Progress(len(cases), opts.progress)
        # frozen, torch's million objects are not scanned by the collections between blocks
        gc.collect()
        gc.freeze()
        try:
            for case in cases:
                bar.step(case.name)
                try:
                    times = measure(comm, case, opts.calls, opts.trials, opts.warmup, sides)
                except RuntimeError as exc:
                    if base is named:
                        raise
                    # torch's barrier asks torch._C._get_accelerator(), which a simulated
                    # private device (npu, mlu) answers only where torch lets Python
                    # register its hooks (commlib.testing.simulated): else the row is left out
                    print(
                        f"commlib bench: {case.name} not timed over simulated devices: {exc}",
                        file=sys.stderr,
                    )
                    continue
                rows.append(_row(comm, base, case, times, opts, before, base is not named))
        finally:
            bar.close()
            gc.unfreeze()
    return rows


def _row(
    comm: Communicator,
    backend: Backend,
    case: DispatchCase,
    times: dict[str, list[float]],
    opts: BenchOptions,
    observers: list[str],
    simulated: bool,
) -> Row:
    row: Row = {
        "case": case.op,
        "op": case.op,
        "kind": KIND,
        "backend": backend.name,
        "plugin": comm.backend,
        "engine": FAKE,
        "device": comm.device.type,
        "world_size": comm.world_size,
        "size_bytes": ELEMENTS * 4,
        "calls": opts.calls,
        "warmup": max(1, opts.warmup),
        "trials": len(times["torch"]),
        "observers": list(observers),
        "simulated": simulated,
        "torch_time_us": stats.median(times["torch"]) * 1e6,
        "torch_trials_us": [t * 1e6 for t in times["torch"]],
    }
    for side in VARIANTS:
        s = stats.row_stats(times[side], times["torch"])
        row[f"{side}_time_us"] = s["commlib"] * 1e6
        row[f"{side}_added_us"] = (s["commlib"] - s["torch"]) * 1e6
        row[f"{side}_ratio"] = s["ratio"]
        row[f"{side}_ratio_low"] = s["ratio_low"]
        row[f"{side}_ratio_high"] = s["ratio_high"]
        row[f"{side}_noise"] = s["noise"]
        row[f"{side}_trials_us"] = [t * 1e6 for t in times[side]]
    return row
