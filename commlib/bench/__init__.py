"""``commlib bench``: every collective, commlib against plain torch.distributed.

nccl-tests style: a sweep of sizes, one row per size with time, algorithm
bandwidth and bus bandwidth, for commlib and for the equivalent
torch.distributed call measured in the same run, in repeated interleaved
trials, plus their time ratio with its spread over the trials (a noise flag
where the trials disagree) and peak memory. Modules, one job each:

* :mod:`~commlib.bench.cases`: what is measured (the commlib and torch calls);
* :mod:`~commlib.bench.timing`: how one case is timed on a rank;
* :mod:`~commlib.bench.stats`: trials to a median, a spread and a noise flag;
* :mod:`~commlib.bench.runner`: the sweep every rank runs;
* :mod:`~commlib.bench.launcher`: starting the ranks (or joining torchrun's);
* :mod:`~commlib.bench.report`: table, JSON and plot;
* the dispatch kind (``--ops dispatch``), in this process on torch's fake
  process group: :mod:`~commlib.bench.dispatch` (the sides, timing, rows),
  :mod:`~commlib.bench.dispatch_cases` (the calls),
  :mod:`~commlib.bench.fake_world` (the group and its plugin),
  :mod:`~commlib.bench.dispatch_report` (its table);
* :mod:`~commlib.bench.units`, :mod:`~commlib.bench.bandwidth`,
  :mod:`~commlib.bench.memory`, :mod:`~commlib.bench.progress`: helpers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from commlib.bench.cases import select_cases
from commlib.bench.dispatch_cases import select_dispatch
from commlib.bench.launcher import RankFailure, launch_local, launch_with, under_torchrun
from commlib.bench.options import BenchOptions
from commlib.bench.runner import run_rank

__all__ = ["BenchOptions", "RankFailure", "run", "run_rank"]


def _launch_command(opts: BenchOptions) -> list[str] | None:
    """The backend's own launcher for ``opts.nproc`` ranks (``mpiexec``), or ``None``."""
    if opts.backend is None:
        return None
    from commlib.bench.options import backend_plugin

    return backend_plugin(opts.backend).launch_command(opts.nproc)


def run(opts: BenchOptions, argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and report it; the exit status for the command line.

    Alone, it starts ``opts.nproc`` local ranks (with the backend's own
    launcher where it has one: ``mpiexec`` for ``mpi``); under torchrun it is
    one of the given ranks and rank 0 reports. A failed rank ends the run with its
    error on stderr and status 1. The dispatch cases run first, in this
    process (rank 0's under torchrun).

    Examples:
        >>> opts = BenchOptions(ops="all_reduce", max_bytes=64 << 10)
        >>> run(opts)                     # starts 2 ranks, prints the table  # doctest: +SKIP
        0
    """
    from commlib.bench import report

    if opts.plot and not report.have_matplotlib():
        print(f"commlib bench: {report.PLOT_HINT}", file=sys.stderr)
        return 2
    across_ranks, dispatch = select_cases(opts.ops), select_dispatch(opts.ops)
    torchrun = under_torchrun()
    # under torchrun rank 0 alone times dispatch (the others wait in the rendezvous)
    leader = not torchrun or os.environ.get("RANK", "0") == "0"
    rows: list[dict[str, Any]] = []
    try:
        if dispatch and leader:
            from commlib.bench.dispatch import run_dispatch

            rows += run_dispatch(opts)
        if across_ranks:
            command = None if torchrun else _launch_command(opts)
            if torchrun:
                ranked = run_rank(opts)
            elif command is not None:
                ranked = launch_with(command, opts, timeout=opts.timeout)
            else:
                ranked = launch_local(opts.nproc, run_rank, opts, timeout=opts.timeout)
            rows += ranked or []
    except RankFailure as exc:
        if exc.traceback:
            print(exc.traceback.rstrip(), file=sys.stderr)
        print(f"commlib bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ncommlib bench: interrupted", file=sys.stderr)
        return 130
    if not leader:  # a rank other than 0 under torchrun: rank 0 reports
        return 0
    report.print_table(rows, opts.format)
    if opts.json:
        report.write_json(opts.json, rows, {**report.metadata(argv), "options": asdict(opts)})
        print(f"wrote {opts.json}", file=sys.stderr)
    if opts.plot:
        report.plot(opts.plot, rows)
        print(f"wrote {opts.plot}", file=sys.stderr)
    return 0
