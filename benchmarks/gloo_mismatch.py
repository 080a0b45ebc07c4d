"""What torch's gloo does when two ranks call a collective with different arguments.

The facts the argument check's design rests on (:mod:`commlib._guard`): plain
``torch.distributed`` on gloo, no commlib, 2 ranks, each case in two fresh
processes. For each case: how each rank ended (completed, raised, or the
signal that ended it) and whether an all_reduce on the group works after it.

* ``broadcast_size``: src sends 1000 floats, the other rank receives 500;
* ``broadcast_size_larger``: src sends 500, the other receives 1000;
* ``broadcast_src``: each rank names itself src;
* ``scatter_size``: the receiver's tensor is half of src's pieces;
* ``all_to_all_size``: the ranks' inputs differ in length.

So a data round may not start before every rank knows the others' sizes and
roots (the check's round), unless its sizes and roots come from what every
rank already agreed on: overlapping the check with the engine's own
collective of the call's arguments would end processes on a mismatch.

Usage:
    python benchmarks/gloo_mismatch.py [--cases broadcast_size,broadcast_src] [--timeout 5]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import signal
import tempfile

import torch
import torch.distributed as dist

CASES = (
    "broadcast_size",
    "broadcast_size_larger",
    "broadcast_src",
    "scatter_size",
    "all_to_all_size",
)


def _call(case: str, rank: int) -> None:
    if case == "broadcast_size":
        dist.broadcast(torch.ones(1000 if rank == 0 else 500), 0)
    elif case == "broadcast_size_larger":
        dist.broadcast(torch.ones(500 if rank == 0 else 1000), 0)
    elif case == "broadcast_src":
        dist.broadcast(torch.ones(1000), rank)
    elif case == "scatter_size":
        pieces = [torch.ones(1000), torch.ones(1000)] if rank == 0 else None
        dist.scatter(torch.empty(1000 if rank == 0 else 500), pieces, 0)
    elif case == "all_to_all_size":
        x = torch.ones(1000 if rank == 0 else 500)
        dist.all_to_all_single(torch.empty_like(x), x)


def _rank(case: str, rank: int, rendezvous: str, timeout: float, out: mp.Queue) -> None:
    dist.init_process_group(
        "gloo",
        f"file://{rendezvous}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=timeout),
    )
    try:
        _call(case, rank)
        outcome = "completed"
    except Exception as exc:
        outcome = f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
    try:
        dist.all_reduce(torch.ones(1))
        after = "all_reduce after: ok"
    except Exception as exc:
        after = f"all_reduce after: {type(exc).__name__}: {str(exc).splitlines()[0][:60]}"
    out.put((rank, outcome, after))
    out.close()
    out.join_thread()  # said before leaving
    os._exit(0)  # the group may be broken: no teardown to hang in


def run_case(case: str, timeout: float) -> list[str]:
    """Each rank's ending in ``case``, as lines."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as where:
        rendezvous = os.path.join(where, "rendezvous")
        procs = [
            ctx.Process(target=_rank, args=(case, r, rendezvous, timeout, out)) for r in range(2)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(4 * timeout + 60)
            if p.is_alive():
                p.kill()
                p.join()
    said = {}
    while not out.empty():
        rank, outcome, after = out.get()
        said[rank] = f"{outcome}; {after}"
    lines = []
    for r, p in enumerate(procs):
        if r in said:
            lines.append(f"rank {r}: {said[r]}")
        elif p.exitcode is not None and p.exitcode < 0:
            lines.append(f"rank {r}: ended by {signal.Signals(-p.exitcode).name}")
        else:
            lines.append(f"rank {r}: ended with status {p.exitcode}, said nothing")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--timeout", type=float, default=5.0, help="the group's timeout (s)")
    args = parser.parse_args()
    print(f"# torch {torch.__version__}, gloo, 2 ranks, group timeout {args.timeout:g} s")
    for case in args.cases.split(","):
        for line in run_case(case, args.timeout):
            print(f"{case:22s} {line}", flush=True)


if __name__ == "__main__":
    main()
