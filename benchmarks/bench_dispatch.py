"""What a call costs on its way to the engine: commlib against torch on torch's fake group.

Dispatch alone: torch's fake process group
(``torch.testing._internal.distributed.fake_pg``) answers every collective
at once without sending anything, so a call's time is the Python and C++
between the caller and the engine. In one process, with no ranks to start,
this times per collective torch's own call (``torch.distributed.X(...,
group=pg)``) and commlib's :class:`~commlib.Communicator` method three ways:
unchecked (``strict=False``), with one observer plugin registered (both hooks,
doing nothing) and with the flight recorder registered. The sides take turns
in blocks of ``--calls`` calls, in an order that rotates each trial; each
row gives the median time per call over ``--trials`` trials, commlib's ratio
to torch and its spread (lowest-highest per-trial ratio). It is the
measurement ``commlib bench --ops dispatch`` makes (:mod:`commlib.bench.dispatch`),
here for several world sizes in one run, with a profile of where commlib's
time goes on request.

Usage::

    python benchmarks/bench_dispatch.py                         # worlds 2 and 8, every collective
    python benchmarks/bench_dispatch.py --world 8 --ops all_reduce,broadcast --trials 11
    python benchmarks/bench_dispatch.py --profile all_reduce    # cProfile of commlib's call
    python benchmarks/bench_dispatch.py --profile all_reduce --side recorder  # ... recorded
    python benchmarks/bench_dispatch.py --layers all_reduce --world 8 --trials 9  # layer map

Examples:
    >>> main(["--world", "2", "--ops", "all_reduce", "--calls", "100", "--trials", "3"])
    ... # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import os
import pstats
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

import commlib
from commlib.bench import dispatch_report
from commlib.bench.dispatch import NoOpObserver, run_dispatch
from commlib.bench.dispatch_cases import CASES
from commlib.bench.fake_world import dispatch_plugin, fake_world
from commlib.bench.options import BenchOptions, backend_plugin
from commlib.observe import FlightRecorder

OPS = [c.op for c in CASES]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(commlib.__file__)))


def compare(worlds: list[int], ops: list[str], calls: int, trials: int) -> None:
    """Print, per world size, the markdown table and the summary of every collective."""
    spec = ",".join(f"{op}[dispatch]" for op in ops)
    for world in worlds:
        opts = BenchOptions(nproc=world, ops=spec, calls=calls, trials=trials, progress=False)
        rows = run_dispatch(opts)
        print(f"\n## world size {world}, plugin {rows[0]['plugin']} ({rows[0]['device']})\n")
        print(dispatch_report.format_markdown(rows))
        print("\n```text\n" + "\n".join(dispatch_report.summary(rows)) + "\n```", flush=True)


def profile(op: str, world: int, calls: int, top: int = 25, side: str = "unchecked") -> None:
    """cProfile of ``calls`` commlib calls of ``op``: the functions by own time.

    ``side``: ``unchecked`` (no observer), ``observer`` (the dispatch kind's
    one observer registered) or ``recorder`` (the flight recorder, its ring
    full, as in a job).

    Times are per call, in microseconds, with the profiler's own overhead in
    them (it inflates short functions most): read them as shares, and the
    table of :func:`compare` for the real cost.
    """
    case = next(c for c in CASES if c.op == op)
    plugin = {"observer": NoOpObserver, "recorder": FlightRecorder}.get(side)
    with fake_world(world, dispatch_plugin(backend_plugin(None))) as comm:
        call = case.prepare(comm)["commlib"]
        observer = plugin() if plugin is not None else None
        if observer is not None:
            commlib.plugins.plugin_manager().register(observer)
        try:
            for _ in range(200 if observer is None else 3000):  # the recorder's ring full
                call()
            gc.collect()
            gc.disable()
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(calls):
                call()
            profiler.disable()
            gc.enable()
        finally:
            if observer is not None:
                commlib.plugins.plugin_manager().unregister(observer)
    # pstats keeps (calls, primitive calls, own time, cumulative time, callers) per function
    found = pstats.Stats(profiler, stream=io.StringIO()).stats  # type: ignore[attr-defined]
    rows = sorted(found.items(), key=lambda kv: kv[1][2], reverse=True)
    total = sum(v[2] for _, v in rows) / calls * 1e6
    print(f"\n{op} ({side}), world {world}: {total:.1f} us per call under the profiler; own time")
    print(f"{'us/call':>8} {'cum':>8}  function")
    for (path, line, name), (_, _, own, cum, _) in rows[:top]:
        where = path.split("site-packages/")[-1]
        if path.startswith(ROOT):
            where = os.path.relpath(path, ROOT)
        print(f"{own / calls * 1e6:8.2f} {cum / calls * 1e6:8.2f}  {name} ({where}:{line})")


def _layer_calls(comm: Any, op: str) -> dict[str, Callable[[], object]]:
    """``op``'s call at each layer of commlib's path, innermost first (all_reduce, broadcast)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    x, pg, engine, plugin = torch.ones(4), comm.group, comm._engine, comm.plugin
    body = getattr(type(comm), op).__wrapped__  # the method without its wrapper
    # the first call validates and learns the direct call the next ones take
    getattr(comm, op)(x)
    lane = engine.lanes[(op, "sum", x.dtype) if op == "all_reduce" else (op, 0, x.dtype)]
    if op == "all_reduce":
        opts = c10d.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        return {
            "the ProcessGroup's own method and wait(), options made once": (
                lambda: pg.allreduce([x], opts).wait()
            ),
            "torch.distributed.all_reduce, for comparison": lambda: dist.all_reduce(x, group=pg),
            "the plugin (EngineGaps, DirectCalls), async_op=True and wait()": (
                lambda: plugin.all_reduce(x, "sum", pg, True).wait()
            ),
            "the engine's typed method (Engine.all_reduce -> Engine._issue)": (
                lambda: engine.all_reduce(x, "sum")
            ),
            "the engine's direct call (Engine.direct, the plugin's lane)": (
                lambda: engine.direct("all_reduce", lane, [x])
            ),
            "the Communicator method's body (its direct call)": lambda: body(comm, x),
            "the whole call (observer and refusal wrapper, no observer)": (
                lambda: comm.all_reduce(x)
            ),
        }
    opts = c10d.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    return {
        "the ProcessGroup's own method and wait(), options made once": (
            lambda: pg.broadcast([x], opts).wait()
        ),
        "torch.distributed.broadcast, for comparison": lambda: dist.broadcast(x, 0, group=pg),
        "the plugin (EngineGaps, DirectCalls), async_op=True and wait()": (
            lambda: plugin.broadcast(x, 0, pg, True).wait()
        ),
        "the engine's typed method (Engine.broadcast -> Engine._issue)": (
            lambda: engine.broadcast(x, 0)
        ),
        "the engine's direct call (Engine.direct, the plugin's lane)": (
            lambda: engine.direct("broadcast", lane, [x])
        ),
        "the Communicator method's body (its direct call)": lambda: body(comm, x, 0),
        "the whole call (observer and refusal wrapper, no observer)": lambda: comm.broadcast(x, 0),
    }


def layers(op: str, world: int, calls: int, trials: int) -> None:
    """Time ``op`` (all_reduce or broadcast) at each layer of the call path, interleaved.

    Each layer's figure is the median of ``trials`` blocks of ``calls``
    calls, the layers taking turns in an order that rotates each block (as
    the dispatch kind's sides do), the collector off inside a block. Each
    line adds one layer to the one above it (torch's own call aside; the
    last two: the whole call with one observer, and with the flight
    recorder, registered for their blocks). Times
    are the process's CPU time, not the clock's: what the calls cost,
    whatever else a shared machine runs meanwhile (on a quiet machine the two
    agree; a wait on another thread counts only its CPU).
    """
    pm = commlib.plugins.plugin_manager()
    with fake_world(world, dispatch_plugin(backend_plugin(None))) as comm:
        calls_of = _layer_calls(comm, op)
        whole = calls_of[list(calls_of)[-1]]
        # the last two lines: the whole call with an observer registered for the block
        observer_of: dict[str, Any] = {
            "the whole call, one observer registered (both hooks, doing nothing)": NoOpObserver(),
            "the whole call, the flight recorder registered (its ring full)": FlightRecorder(),
        }
        calls_of.update({name: whole for name in observer_of})
        names = list(calls_of)
        for name, call in calls_of.items():
            with _registered(pm, observer_of.get(name)):
                for _ in range(200 if name not in observer_of else 3000):
                    call()
        times: dict[str, list[float]] = {n: [] for n in names}
        gc.collect()
        for trial in range(trials):
            k = trial % len(names)
            for name in names[k:] + names[:k]:
                call = calls_of[name]
                with _registered(pm, observer_of.get(name)):
                    call()  # the first call after a registration change looks observers up
                    gc.disable()
                    start = time.process_time_ns()
                    for _ in range(calls):
                        call()
                    times[name].append((time.process_time_ns() - start) / calls / 1e3)
                    gc.enable()
    print(f"\n{op}, world {world}: CPU us per call, median (lowest-highest) of {trials} blocks")
    print(f"load average {' '.join(open('/proc/loadavg').read().split()[:3])}")
    for name in names:
        got = sorted(times[name])
        print(f"{got[len(got) // 2]:7.2f}  ({got[0]:.2f}-{got[-1]:.2f})  {name}")


@contextlib.contextmanager
def _registered(pm: Any, plugin: Any) -> Iterator[None]:
    """``plugin`` registered for the block (nothing when it is None)."""
    if plugin is None:
        yield
        return
    pm.register(plugin)
    try:
        yield
    finally:
        pm.unregister(plugin)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="2,8", help="fake world sizes, comma-separated")
    parser.add_argument("--ops", default=",".join(OPS), help=f"from {', '.join(OPS)}")
    parser.add_argument("--calls", type=int, default=2000, help="calls of each side per trial")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--profile", metavar="OP", help="profile commlib's OP instead")
    parser.add_argument(
        "--side",
        default="unchecked",
        choices=("unchecked", "observer", "recorder"),
        help="with --profile: no observer, one observer, or the flight recorder",
    )
    parser.add_argument(
        "--layers",
        metavar="OP",
        choices=("all_reduce", "broadcast"),
        help="time OP (all_reduce or broadcast) at each layer of the call path instead",
    )
    args = parser.parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops + ([args.profile] if args.profile else []) if o not in OPS]
    if unknown:
        parser.error(f"unknown collectives {unknown}; choose from {OPS}")
    worlds = [int(w) for w in args.world.split(",")]
    print(f"torch {torch.__version__}, commlib {commlib.__version__}; times in us per call")
    if args.profile:
        profile(args.profile, worlds[0], args.calls * 10, side=args.side)
        return
    if args.layers:
        layers(args.layers, worlds[0], args.calls, args.trials)
        return
    compare(worlds, ops, args.calls, args.trials)


if __name__ == "__main__":
    main()
