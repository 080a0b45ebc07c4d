"""commlib's tensor gathers (and the dispatch of the others) against torch.distributed's.

Starts a local gloo world on 127.0.0.1 (:class:`commlib.testing.World`) per
``--nproc`` and, for every collective and size, times commlib's call (the
module-level API, default settings: the argument check on) and the same call
of a plain ``torch.distributed`` program, in the same processes. Fairness as
in ``commlib bench``: the two alternate call by call (which goes first
alternates too), every timed call starts right after a barrier, and a call's
time is its slowest rank's. Each round times ``--iters`` calls of each;
the ratio of a round is commlib's median over torch's, and the table shows the
median ratio over ``--rounds`` rounds with its spread (lowest-highest).

Sizes are what ``commlib bench`` calls a size: the bytes gathered in all
(``world_size`` x each rank's tensor) for the gathers, the tensor's bytes for
``all_reduce`` and ``broadcast``. Torch's ``all_gather`` and ``gather``
allocate their outputs inside the call, as a torch program has to (commlib
returns new tensors); ``all_gather_into_tensor`` writes into one buffer both
ways.

Usage::

    python benchmarks/bench_gather.py                       # worlds 2 and 4, 1 KiB-16 MiB
    python benchmarks/bench_gather.py --nproc 2 --ops gather --sizes 16M --rounds 7
    python benchmarks/bench_gather.py --ops all_reduce,broadcast,all_gather_into_tensor \\
        --sizes 1K,4K,64K,1M                                # the dispatch of the others

Examples:
    >>> main(["--nproc", "2", "--ops", "all_gather", "--sizes", "1K", "--rounds", "2"])
    ... # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as tdist

import commlib
from commlib.testing import World

OPS = ("all_gather", "all_gather_into_tensor", "gather", "all_reduce", "broadcast")
DEFAULT_OPS = ("all_gather", "all_gather_into_tensor", "gather")
DEFAULT_SIZES = ("1K", "4K", "16K", "64K", "256K", "1M", "4M", "16M")
IMPLS = ("commlib", "torch")

_all_gather_single = getattr(tdist, "all_gather_single", None) or tdist.all_gather_into_tensor


def parse_size(text: str) -> int:
    """``"16M"`` -> 16777216.

    Examples:
        >>> parse_size("4K"), parse_size("16M"), parse_size("100")
        (4096, 16777216, 100)
    """
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def _calls(comm: Any, op: str, size: int) -> dict[str, Callable[[], Any]]:
    """The two ways of calling ``op`` at ``size`` on this rank."""
    n, me = comm.world_size, comm.rank
    gathers = op in ("all_gather", "all_gather_into_tensor", "gather")
    count = max(1, size // (4 * (n if gathers else 1)))
    x = torch.full((count,), float(me))
    if op == "all_gather":

        def theirs() -> Any:
            out = [torch.empty_like(x) for _ in range(n)]
            tdist.all_gather(out, x)
            return out

        return {"commlib": lambda: commlib.all_gather(x), "torch": theirs}
    if op == "all_gather_into_tensor":
        outs = {impl: torch.empty(n * count) for impl in IMPLS}
        return {
            "commlib": lambda: commlib.all_gather_into_tensor(outs["commlib"], x),
            "torch": lambda: _all_gather_single(outs["torch"], x),
        }
    if op == "gather":

        def gather_theirs() -> Any:
            out = [torch.empty_like(x) for _ in range(n)] if me == 0 else None
            tdist.gather(x, out, dst=0)
            return out

        return {"commlib": lambda: commlib.gather(x, dst=0), "torch": gather_theirs}
    if op == "all_reduce":
        return {"commlib": lambda: commlib.all_reduce(x), "torch": lambda: tdist.all_reduce(x)}
    return {"commlib": lambda: commlib.broadcast(x, 0), "torch": lambda: tdist.broadcast(x, 0)}


def _iters(size: int, iters: int) -> int:
    """Fewer calls for large sizes: about the same time per size."""
    return max(5, iters if size <= 1 << 18 else iters * (1 << 18) // size)


def _on_measure(comm: Any, ops: list[str], sizes: list[int], iters: int, rounds: int) -> dict:
    """This rank's times: (op, size) -> impl -> round -> seconds per call."""
    out: dict = {}
    for op in ops:
        for size in sizes:
            calls = _calls(comm, op, size)
            for impl in IMPLS:  # warm up: first calls (and commlib's learnt slot)
                for _ in range(2):
                    calls[impl]()
            k = _iters(size, iters)
            times: dict[str, list[list[float]]] = {impl: [] for impl in IMPLS}
            for _ in range(rounds):
                runs: dict[str, list[float]] = {impl: [] for impl in IMPLS}
                for i in range(k):
                    for impl in IMPLS if i % 2 == 0 else IMPLS[::-1]:
                        tdist.barrier()
                        start = time.perf_counter()
                        calls[impl]()
                        runs[impl].append(time.perf_counter() - start)
                for impl in IMPLS:
                    times[impl].append(runs[impl])
            out[(op, size)] = times
    return out


def _slowest(per_rank: list[dict], key: tuple[str, int], impl: str) -> list[float]:
    """Per round, the median over calls of the slowest rank's time."""
    rounds = len(per_rank[0][key][impl])
    medians = []
    for r in range(rounds):
        calls = zip(*(rank[key][impl][r] for rank in per_rank))
        medians.append(statistics.median(max(c) for c in calls))
    return medians


def _fmt_size(size: int) -> str:
    for unit, factor in (("M", 1 << 20), ("K", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def report(nproc: int, per_rank: list[dict]) -> list[str]:
    """Markdown rows: op, size, torch and commlib times, median ratio [spread]."""
    lines = []
    for key in per_rank[0]:
        ours, theirs = _slowest(per_rank, key, "commlib"), _slowest(per_rank, key, "torch")
        ratios = sorted(c / t for c, t in zip(ours, theirs))
        lines.append(
            f"| {nproc} | {key[0]} | {_fmt_size(key[1])} | {statistics.median(theirs) * 1e3:.3f} "
            f"| {statistics.median(ours) * 1e3:.3f} | {statistics.median(ratios):.2f} "
            f"| {ratios[0]:.2f}-{ratios[-1]:.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", default="2,4", help="world sizes, comma-separated")
    parser.add_argument("--ops", default=",".join(DEFAULT_OPS), help=f"from {', '.join(OPS)}")
    parser.add_argument("--sizes", default=",".join(DEFAULT_SIZES))
    parser.add_argument("--iters", type=int, default=30, help="calls per round up to 256K")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        parser.error(f"unknown --ops {unknown}; choose from {OPS}")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    print(f"gloo, torch {torch.__version__}; times in ms (median per round, slowest rank)")
    print("| world | op | size | torch | commlib | commlib/torch | spread |")
    print("|---|---|---|---:|---:|---:|---|")
    for nproc in (int(n) for n in args.nproc.split(",")):
        with World(nproc, timeout=3600) as world:
            per_rank = world.run(_on_measure, ops, sizes, args.iters, args.rounds, timeout=3600)
        for line in report(nproc, per_rank):
            print(line, flush=True)


if __name__ == "__main__":
    main()
