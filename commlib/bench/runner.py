"""What every rank runs: the sweep over cases and sizes, reduced to rank 0's rows."""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import commlib
from commlib import plugins
from commlib.bench import bandwidth, stats
from commlib.bench.cases import SIDES, Case, Prepared, prepare_sides, select_cases
from commlib.bench.launcher import note_failure
from commlib.bench.memory import single_arena, steady_malloc
from commlib.bench.named_plugin import as_registered
from commlib.bench.options import BenchOptions
from commlib.bench.progress import Progress
from commlib.bench.timing import measure, probe_memory
from commlib.bench.units import format_size, iterations_for
from commlib.communicator import Communicator

Row = dict[str, Any]


@dataclass
class _Result:
    """One (case, size) as the ranks agreed on it: the slowest rank's figure per trial."""

    case: Case
    nbytes: int
    count: int
    iters: int
    warmup: int
    trials: dict[str, list[float]]
    rss: dict[str, float] | None = None


def run_rank(opts: BenchOptions) -> list[Row] | None:
    """Run the benchmark on this rank; rank 0 returns the rows, the others ``None``.

    Starts the process group from the launcher's environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ...) unless one is already running, with
    ``opts.timeout`` as its timeout so a lost peer fails the run instead of
    hanging it. Meant for a process of its own: with ``opts.memory`` it
    changes how glibc allocates for the rest of the process.

    Examples:
        >>> # each rank of: torchrun --nproc-per-node 2 --no-python commlib bench
        >>> rows = run_rank(BenchOptions(ops="all_reduce", max_bytes=4096))  # doctest: +SKIP
    """
    started = not dist.is_initialized()
    if opts.memory:
        single_arena()  # before the engine's threads start: see commlib.bench.memory
    if started:
        backend = as_registered(opts.backend)  # a module:Class plugin: loaded in each rank
        commlib.init_dist("pytorch", backend=backend, timeout=opts.timeout)
    try:
        return sweep(commlib.get_communicator(), opts)
    except BaseException as exc:
        note_failure(exc)  # now, before the teardown below wakes the peers with errors
        raise
    finally:
        if started:
            dist.destroy_process_group()


def plan(cases: list[Case], sizes: list[int]) -> list[tuple[Case, int]]:
    """Every (case, size) to run, in order; fixed-size cases appear once.

    Examples:
        >>> [(c.name, s) for c, s in plan(select_cases("broadcast"), [1024, 4096])]
        [('broadcast', 1024), ('broadcast', 4096)]
    """
    return [(c, s) for c in cases for s in ([0] if c.fixed_size else sizes)]


def sweep(comm: Communicator, opts: BenchOptions) -> list[Row] | None:
    """Run every selected case at every size on ``comm``; rank 0 gets the rows.

    Two passes: all timing first, then (``opts.memory``) the peak-memory
    probes, which change how the allocator behaves for the rest of the run.

    Examples:
        >>> comm = commlib.get_communicator()   # in every rank of a running group
        >>> rows = sweep(comm, BenchOptions(ops="tensor"))  # doctest: +SKIP
        >>> rows[0]["case"], rows[0]["ratio"]             # doctest: +SKIP
        ('all_reduce', 1.02)
    """
    cases = [c for c in select_cases(opts.ops) if comm.world_size >= c.min_world]
    comms = sides(comm, opts.strict)
    torch_side = baseline(comm)
    steps = plan(cases, opts.sizes())
    bar = Progress(len(steps) * (2 if opts.memory else 1), opts.progress and comm.rank == 0)
    results: list[_Result] = []
    # torch's import leaves ~10^6 objects: a full collection costs tens of ms.
    # Frozen, they are never scanned again, so collections during the sweep
    # (and the one before each memory probe) stay cheap.
    gc.collect()
    gc.freeze()
    try:
        for i, (case, size) in enumerate(steps):
            if i == len(steps) - 1:
                _injected_failure(comm.rank)
            bar.step(_label(case, size))
            results.append(_time_one(comms, case, size, opts, torch_side))
        if opts.memory:
            steady_malloc()
            for result, (case, size) in zip(results, steps):
                bar.step("peak memory: " + _label(case, size))
                prepared = prepare_sides(case, comms, size, torch_side)
                grown = probe_memory(prepared, comm.group, comm.plugin.synchronize)
                result.rss = _worst(comm, grown)
    finally:
        bar.close()
        gc.unfreeze()
    if comm.rank != 0:
        return None
    rows = [_row(comm, r, opts.strict, comms["commlib"].checks) for r in results]
    if torch_side is not None:  # torch's calls ran on another engine: say which
        for row in rows:
            row["torch_backend"] = str(dist.get_backend(torch_side.group))
    return rows


def baseline(comm: Communicator) -> Communicator | None:
    """What torch's side runs on when ``comm``'s engine is not one torch.distributed ships.

    A plugin that finds its ranks itself (:attr:`~commlib.Backend.own_rendezvous`,
    MPI) is compared with torch.distributed on the engine torch picks for the
    device, in the same ranks: a group of it over the world's store. ``None``
    (torch's calls run on ``comm``'s own group) for every other backend.

    Examples:
        >>> baseline(comm) is None             # a world on a torch engine  # doctest: +SKIP
        True
    """
    if not comm.plugin.own_rendezvous:
        return None
    plugin = plugins.resolve_backend(comm.device.type)
    if plugin.own_rendezvous or plugin.torch_backend is None:
        return None
    group = dist.new_group(backend=plugin.torch_backend, timeout=comm.timeout)
    return Communicator(group, backend=plugin, timeout=comm.timeout)


def sides(comm: Communicator, strict: str) -> dict[str, Communicator]:
    """The communicator of each commlib side for ``--strict``, all over ``comm``'s group.

    ``"default"``: ``comm`` as it is; ``"on"`` / ``"off"``: ``comm`` set
    strict / unchecked; ``"both"``: ``comm`` as it is and, as side
    ``"unchecked"``, a communicator of the same group with ``strict=False``.
    Every rank calls it alike.

    Examples:
        >>> list(sides(comm, "both"))       # every rank of a running group  # doctest: +SKIP
        ['commlib', 'unchecked']
    """
    if strict == "on":
        comm.strict = True
    elif strict == "off":
        comm.strict = False
    comms = {"commlib": comm}
    if strict == "both":
        comms["unchecked"] = Communicator(comm.group, strict=False, timeout=comm.timeout)
    return comms


def _time_one(
    comms: dict[str, Communicator],
    case: Case,
    size: int,
    opts: BenchOptions,
    torch_side: Communicator | None = None,
) -> _Result:
    comm = comms["commlib"]
    prepared: Prepared = prepare_sides(case, comms, size, torch_side)
    iters = iterations_for(prepared.nbytes, opts.iters)
    warmup = iterations_for(prepared.nbytes, opts.warmup, floor=1)
    m = measure(prepared, iters, warmup, comm.group, comm.plugin.synchronize, opts.trials)
    impls = m.impls()
    mine = {f"{impl} {t}": s for impl in impls for t, s in enumerate(m.trial_medians(impl))}
    worst = _worst(comm, mine)  # per trial: a collective is as slow as its slowest rank
    trials = {impl: [worst[f"{impl} {t}"] for t in range(opts.trials)] for impl in impls}
    return _Result(case, prepared.nbytes, prepared.count, iters, warmup, trials)


def _injected_failure(rank: int) -> None:
    """Fail this rank if ``COMMLIB_BENCH_FAIL_RANK`` names it.

    For checking that one failed rank ends the whole run with its error (the
    others are inside collectives by then) instead of hanging it.
    """
    if os.environ.get("COMMLIB_BENCH_FAIL_RANK") == str(rank):
        raise RuntimeError(f"injected failure on rank {rank} (COMMLIB_BENCH_FAIL_RANK)")


def _label(case: Case, size: int) -> str:
    return case.name if case.fixed_size else f"{case.name} {format_size(size)}"


def _worst(comm: Communicator, mine: Mapping[str, float]) -> dict[str, float]:
    """Each figure's maximum over the ranks: a collective is as slow as its slowest rank."""
    t = torch.tensor(list(mine.values()), dtype=torch.float64, device=comm.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=comm.group)
    return dict(zip(mine, t.tolist()))


def _row(comm: Communicator, r: _Result, strict: str, checks: str) -> Row:
    n = comm.world_size
    row: Row = {
        "case": r.case.name,
        "op": r.case.op,
        "payload": r.case.payload,
        "kind": r.case.kind,
        "backend": comm.backend,
        "device": comm.device.type,
        "world_size": n,
        "size_bytes": r.nbytes,
        "count": r.count,
        "iters": r.iters,
        "warmup": r.warmup,
        "trials": len(r.trials["commlib"]),
        "busbw_factor": bandwidth.busbw_factor(r.case.op, n),
        # --strict, and which collectives the commlib column checked (Communicator.checks)
        "strict": strict,
        "checks": checks,
    }
    s = stats.row_stats(r.trials["commlib"], r.trials["torch"])
    for impl in (i for i in SIDES if i in r.trials):
        secs = stats.median(r.trials[impl])
        row[f"{impl}_time_us"] = secs * 1e6
        row[f"{impl}_algbw_gbps"] = bandwidth.algbw(r.nbytes, secs)
        row[f"{impl}_busbw_gbps"] = bandwidth.busbw(r.case.op, r.nbytes, secs, n)
        # None: run with --no-memory
        row[f"{impl}_peak_rss_mib"] = None if r.rss is None else r.rss[impl] / (1 << 20)
        row[f"{impl}_trials_us"] = [t * 1e6 for t in r.trials[impl]]
    row["ratio"] = s["ratio"]
    row["ratio_low"] = s["ratio_low"]
    row["ratio_high"] = s["ratio_high"]
    row["noise"] = s["noise"]
    if "unchecked" in r.trials:
        # unchecked against torch, and the check's price: checked against unchecked
        for prefix, (mine, theirs) in (
            ("unchecked_", ("unchecked", "torch")),
            ("check_", ("commlib", "unchecked")),
        ):
            u = stats.row_stats(r.trials[mine], r.trials[theirs])
            for key in ("ratio", "ratio_low", "ratio_high", "noise"):
                row[prefix + key] = u[key]
    return row
