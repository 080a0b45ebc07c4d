"""commlib's object collectives against torch.distributed's, in the same run.

Starts ``--sizes`` local gloo worlds on 127.0.0.1 (the :class:`commlib.testing.World`
harness), and in each one times every case both ways, alternating the two
implementations from one iteration to the next so both see the same machine.
Per case it prints:

* time: the median over iterations of the median rank and of the slowest rank
  (every iteration starts from a barrier);
* speedup: torch's slowest-rank time over commlib's (above 1: commlib is faster);
* peak RSS growth per rank during the call (VmHWM after the call minus VmRSS
  before it, with the high-water mark reset through ``/proc/self/clear_refs``),
  the largest over ranks and iterations, also as a multiple of the payload.

Usage::

    python benchmarks/bench_objects.py                 # world sizes 2 and 4, 64 MiB
    python benchmarks/bench_objects.py --sizes 2 --big-mib 16 --reps 3
    python benchmarks/bench_objects.py --payload-kib 16 256 1024 16384 65536

Examples:
    >>> main(["--sizes", "2", "--big-mib", "4", "--reps", "2", "--small-reps", "50"])
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from commlib.testing import World

CASES = {
    "ag-small": "all_gather_object, small dict",
    "ag-numpy": "all_gather_object, dict with {size} float32 numpy",
    "ag-tensor": "all_gather_object, dict with {size} CPU tensor",
    "bcast": "broadcast_object_list, {size} numpy (src 0)",
    "gather": "gather_object, {size} numpy to rank 0",
}
IMPLS = ("torch", "commlib")


# -- memory ------------------------------------------------------------------------------
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    """Reset this process's VmHWM to its current RSS; False where Linux does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# -- one case on one rank ---------------------------------------------------------------
def _payload(case: str, rank: int, nbytes: int) -> Any:
    if case == "ag-small":
        return {"rank": rank, "loss": 0.1234, "acc": [0.91, 0.87], "name": "epoch-3"}
    if case == "ag-tensor":
        return {"rank": rank, "w": torch.full((nbytes // 4,), float(rank))}
    return {"rank": rank, "w": np.full(nbytes // 4, rank, dtype=np.float32)}


def _call(comm: Any, case: str, impl: str, obj: Any) -> Any:
    world, rank = comm.world_size, comm.rank
    if case.startswith("ag-"):
        if impl == "torch":
            out = [None] * world
            dist.all_gather_object(out, obj)
            return out
        return comm.all_gather_object(obj)
    if case == "gather":
        if impl == "torch":
            out = [None] * world if rank == 0 else None
            dist.gather_object(obj, out, dst=0)
            return out
        return comm.gather_object(obj, dst=0)
    box = [obj] if rank == 0 else [None]
    if impl == "torch":
        dist.broadcast_object_list(box, src=0)
    else:
        comm.broadcast_object_list(box, src=0)
    return box


def _check(result: Any, case: str, rank: int, world: int) -> None:
    """Fail loudly if an implementation returned the wrong thing (a benchmark of a bug)."""
    if case == "bcast":
        ranks = [0]
        got = result
    elif case == "gather":
        if rank != 0:
            assert result is None
            return
        ranks, got = list(range(world)), result
    else:
        ranks, got = list(range(world)), result
    assert [g["rank"] for g in got] == ranks
    if "w" in got[-1]:
        assert float(got[-1]["w"][-1]) == float(ranks[-1])


def _measure(comm: Any, case: str, reps: int, warmup: int, nbytes: int) -> dict:
    """Time ``case`` both ways on this rank, then measure its peak RSS growth.

    Timing and memory are measured in separate passes: resetting the
    high-water mark and reading ``/proc`` between calls would disturb the
    timing of sub-millisecond calls.
    """
    warnings.simplefilter("ignore")  # torch 2.13's deprecation notices
    obj = _payload(case, comm.rank, nbytes)
    out: dict[str, dict[str, list]] = {impl: {"seconds": [], "rss": []} for impl in IMPLS}
    for impl in IMPLS:
        _check(_call(comm, case, impl, obj), case, comm.rank, comm.world_size)
    for i in range(warmup + reps):
        for impl in IMPLS if i % 2 == 0 else IMPLS[::-1]:
            dist.barrier()
            start = time.perf_counter()
            result = _call(comm, case, impl, obj)
            seconds = time.perf_counter() - start
            del result
            if i >= warmup:
                out[impl]["seconds"].append(seconds)
    can_reset = _reset_peak()
    for i in range(2):
        for impl in IMPLS if i % 2 == 0 else IMPLS[::-1]:
            gc.collect()
            dist.barrier()
            _reset_peak()
            before = _status_kib("VmRSS:")
            result = _call(comm, case, impl, obj)
            peak = _status_kib("VmHWM:")
            del result
            out[impl]["rss"].append((peak - before) * 1024 if can_reset else -1)
    return out


# -- driver ---------------------------------------------------------------------------------
def _summarize(per_rank: list[dict], impl: str) -> tuple[float, float, float]:
    """(median-rank time, slowest-rank time, peak RSS growth) for one implementation."""
    iterations = list(zip(*(r[impl]["seconds"] for r in per_rank)))
    median = statistics.median(statistics.median(it) for it in iterations)
    slowest = statistics.median(max(it) for it in iterations)
    rss = max(max(r[impl]["rss"]) for r in per_rank)
    return median, slowest, rss


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def _fmt_rss(nbytes: float, payload: int) -> str:
    if nbytes < 0:
        return "n/a"
    mib = nbytes / 2**20
    return f"{mib:.0f} MiB ({nbytes / payload:.1f}x)" if payload else f"{mib:.1f} MiB"


def _plan(cases: list[str], payloads: list[int], reps: int, small_reps: int) -> list:
    """(case, payload bytes, timed iterations, warmup) per row: payloads below 4 MiB get more."""
    plan = []
    for nbytes in payloads:
        for case in cases:
            if case == "ag-small":
                if nbytes == payloads[0]:
                    plan.append((case, 0, small_reps, 20))
            elif nbytes < 4 << 20:
                plan.append((case, nbytes, max(reps, small_reps // 8), 5))
            else:
                plan.append((case, nbytes, reps, 1))
    return plan


def _run(sizes: list[int], cases: list[str], payloads: list[int], reps: int, small_reps: int):
    rows = []
    for size in sizes:
        with World(size, timeout=900, pg_timeout=900) as world:
            for case, nbytes, n_reps, warmup in _plan(cases, payloads, reps, small_reps):
                per_rank = world.run(_measure, case, n_reps, warmup, nbytes, timeout=900)
                t = _summarize(per_rank, "torch")
                c = _summarize(per_rank, "commlib")
                rows.append((size, case, nbytes, t, c))
                _print_row(rows[-1])
                sys.stdout.flush()
    return rows


def _header() -> None:
    print(
        "| world | case | torch median / slowest (ms) | commlib median / slowest (ms) "
        "| speedup | commlib/torch latency | torch peak RSS growth/rank "
        "| commlib peak RSS growth/rank |"
    )
    print("|---|---|---|---|---|---|---|---|")


def _size_name(nbytes: int) -> str:
    """``nbytes`` in KiB or MiB.

    Examples:
        >>> _size_name(16 << 10), _size_name(64 << 20)
        ('16 KiB', '64 MiB')
    """
    if nbytes >= 1 << 20 and not nbytes % (1 << 20):
        return f"{nbytes >> 20} MiB"
    return f"{nbytes / 1024:g} KiB"


def _print_row(row: tuple) -> None:
    size, case, nbytes, t, c = row
    name = CASES[case].format(size=_size_name(nbytes))
    print(
        f"| {size} | {name} | {_fmt_ms(t[0])} / {_fmt_ms(t[1])} | {_fmt_ms(c[0])} / "
        f"{_fmt_ms(c[1])} | {t[1] / c[1]:.1f}x | {c[1] / t[1]:.2f} | {_fmt_rss(t[2], nbytes)} "
        f"| {_fmt_rss(c[2], nbytes)} |"
    )


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print a Markdown table.

    Examples:
        >>> main(["--sizes", "2", "--cases", "ag-small"])
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--big-mib", type=int, default=64, help="payload of the large cases")
    parser.add_argument(
        "--payload-kib",
        type=int,
        nargs="+",
        help="payloads of the large cases in KiB, one row each (instead of --big-mib)",
    )
    parser.add_argument("--reps", type=int, default=7, help="timed iterations, large cases")
    parser.add_argument("--small-reps", type=int, default=400, help="timed iterations, small")
    args = parser.parse_args(argv)
    # glibc raises its mmap threshold after large frees and then keeps freed
    # memory resident, which would hide (or credit) RSS growth depending on
    # what ran before; a fixed threshold maps and unmaps every large block
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, gloo on 127.0.0.1, "
        f"load average before: {os.getloadavg()[0]:.2f}"
    )
    _header()
    payloads = [k << 10 for k in args.payload_kib] if args.payload_kib else [args.big_mib << 20]
    _run(args.sizes, args.cases, payloads, args.reps, args.small_reps)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
