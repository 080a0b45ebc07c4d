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

Examples:
    >>> main(["--world", "2", "--ops", "all_reduce", "--calls", "100", "--trials", "3"])
    ... # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats

import torch

import commlib
from commlib.bench import dispatch_report
from commlib.bench.dispatch import run_dispatch
from commlib.bench.dispatch_cases import CASES
from commlib.bench.fake_world import dispatch_plugin, fake_world
from commlib.bench.options import BenchOptions, backend_plugin

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


def profile(op: str, world: int, calls: int, top: int = 25) -> None:
    """cProfile of ``calls`` unchecked commlib calls of ``op``: the functions by own time.

    Times are per call, in microseconds, with the profiler's own overhead in
    them (it inflates short functions most): read them as shares, and the
    table of :func:`compare` for the real cost.
    """
    case = next(c for c in CASES if c.op == op)
    with fake_world(world, dispatch_plugin(backend_plugin(None))) as comm:
        call = case.prepare(comm)["commlib"]
        for _ in range(200):
            call()
        gc.collect()
        gc.disable()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            call()
        profiler.disable()
        gc.enable()
    # pstats keeps (calls, primitive calls, own time, cumulative time, callers) per function
    found = pstats.Stats(profiler, stream=io.StringIO()).stats  # type: ignore[attr-defined]
    rows = sorted(found.items(), key=lambda kv: kv[1][2], reverse=True)
    total = sum(v[2] for _, v in rows) / calls * 1e6
    print(f"\n{op}, world {world}: {total:.1f} us per call under the profiler; own time per call")
    print(f"{'us/call':>8} {'cum':>8}  function")
    for (path, line, name), (_, _, own, cum, _) in rows[:top]:
        where = path.split("site-packages/")[-1]
        if path.startswith(ROOT):
            where = os.path.relpath(path, ROOT)
        print(f"{own / calls * 1e6:8.2f} {cum / calls * 1e6:8.2f}  {name} ({where}:{line})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="2,8", help="fake world sizes, comma-separated")
    parser.add_argument("--ops", default=",".join(OPS), help=f"from {', '.join(OPS)}")
    parser.add_argument("--calls", type=int, default=2000, help="calls of each side per trial")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--profile", metavar="OP", help="profile commlib's unchecked OP instead")
    args = parser.parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops + ([args.profile] if args.profile else []) if o not in OPS]
    if unknown:
        parser.error(f"unknown collectives {unknown}; choose from {OPS}")
    worlds = [int(w) for w in args.world.split(",")]
    print(f"torch {torch.__version__}, commlib {commlib.__version__}; times in us per call")
    if args.profile:
        profile(args.profile, worlds[0], args.calls * 10)
        return
    compare(worlds, ops, args.calls, args.trials)


if __name__ == "__main__":
    main()
