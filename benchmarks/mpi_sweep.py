"""The mpi plugin's tensor rows against raw mpi4py and torch on gloo, interleaved.

``commlib bench --backend mpi --strict both`` compares commlib on mpi with
torch.distributed on gloo; this adds MPI's own blocking call (the collective
the plugin issues, on the same tensors' memory: ``raw``) to the same trials,
so a row says how much of its time is MPI's transfer and how much is
commlib's layer. The commlib and torch calls are the bench's own
(:mod:`commlib.bench.cases`), timed by its own :func:`~commlib.bench.timing.measure`
(a barrier before every call, the sides taking turns, slowest rank per trial).

Usage (2 ranks, the bench's default sweep of 1K..16M):

    mpiexec -n 2 python benchmarks/mpi_sweep.py [--ops tensor] [--min-bytes 1K]
        [--max-bytes 16M] [--trials 5] [--iters 10] [--json out.json]

Prints one row per (collective, size) with each side's time and the ratios
to torch on gloo, and the geometric means the issue's targets read:
checked / torch (issue 42: <= 0.15x), checked / unchecked (the check's
price: <= 1.6x), and raw / torch, the floor no layer over MPI goes below.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable
from typing import Any

import torch

import commlib
from commlib.bench.cases import Prepared, select_cases
from commlib.bench.runner import baseline, prepare_sides, sides
from commlib.bench.timing import measure
from commlib.bench.units import iterations_for, parse_size, size_sweep


def raw_call(comm: Any, op: str, count: int) -> Callable[[], None]:
    """MPI's blocking call for ``op`` on float32 parts of ``count`` elements (mpi4py).

    The collective the plugin issues (its nonblocking twin, waited in
    slices), on numpy views of preallocated tensors.
    """
    from mpi4py import MPI

    raw = comm.plugin.comm_of(comm.group)
    n, rank = comm.world_size, comm.rank
    one = torch.full((count,), float(rank + 1)).numpy()
    whole = torch.full((n * count,), float(rank + 1)).numpy()
    out = torch.empty(n * count).numpy()
    part = torch.empty(count).numpy()
    if op == "all_reduce":
        return lambda: raw.Allreduce(MPI.IN_PLACE, one, MPI.SUM)  # (returns None)
    if op == "broadcast":
        return lambda: raw.Bcast(one, 0)
    if op == "reduce":
        return lambda: raw.Reduce(MPI.IN_PLACE if rank == 0 else one, one, MPI.SUM, 0)
    if op in ("all_gather", "all_gather_into_tensor"):
        return lambda: raw.Allgather(one, out)
    if op == "gather":
        return lambda: raw.Gather(one, out if rank == 0 else None, 0)
    if op == "reduce_scatter":
        return lambda: raw.Reduce_scatter_block(whole, part, MPI.SUM)
    if op == "scatter":
        return lambda: raw.Scatter(whole if rank == 0 else None, part, 0)
    if op == "all_to_all_single":
        return lambda: raw.Alltoall(whole, out)
    if op == "all_to_all":  # the plugin's Ialltoallv of byte counts
        sizes = [count * 4] * n
        displs = [i * count * 4 for i in range(n)]
        send, recv = [whole, (sizes, displs), MPI.BYTE], [out, (sizes, displs), MPI.BYTE]
        return lambda: raw.Alltoallv(send, recv)
    if op == "send_recv":  # the bench's ping-pong: 0 sends to 1, which sends it back
        back = torch.empty(count).numpy()

        def ping_pong() -> None:
            if rank == 0:
                raw.Send(one, 1)
                raw.Recv(back, 1)
            elif rank == 1:
                raw.Recv(back, 0)
                raw.Send(back, 0)

        return ping_pong
    raise ValueError(f"no raw call for {op!r}")


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="tensor")
    parser.add_argument("--min-bytes", default="1K")
    parser.add_argument("--max-bytes", default="16M")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    commlib.init_dist("mpi", backend="mpi", timeout=300)
    comm = commlib.get_communicator()
    comms = sides(comm, "both")
    torch_side = baseline(comm)
    sizes = size_sweep(parse_size(args.min_bytes), parse_size(args.max_bytes), 4.0)
    rows = []
    for case in select_cases(args.ops):
        if comm.world_size < case.min_world:
            continue
        for size in [0] if case.fixed_size else sizes:
            prepared = prepare_sides(case, comms, size, torch_side)
            calls = {**prepared.calls, "raw": raw_call(comm, case.op, prepared.count)}
            check = prepared.check  # (the raw side returns nothing to check)
            prepared = Prepared(
                prepared.nbytes, prepared.count, calls, lambda out, c=check: out is None or c(out)
            )
            iters = iterations_for(prepared.nbytes, args.iters)
            warmup = iterations_for(prepared.nbytes, args.warmup, floor=1)
            m = measure(prepared, iters, warmup, comm.group, trials=args.trials)
            impls = m.impls()
            mine = torch.tensor(
                [m.trial_medians(i) for i in impls], dtype=torch.float64
            )  # (sides, trials)
            comm.all_reduce(mine, op="max")  # a call is as slow as its slowest rank
            med = {i: float(mine[k].median()) for k, i in enumerate(impls)}
            rows.append({"op": case.name, "bytes": prepared.nbytes, **med})
    if comm.rank != 0:
        return
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else []
    print(f"# mpi vs torch on gloo, {comm.world_size} ranks, {args.trials} trials, load {load}")
    head = "| op | bytes | raw | unchecked | checked | torch gloo | raw/t | unch/t | chk/t |"
    print(head + " chk/unch | unch/raw |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratio: dict[str, list[float]] = {k: [] for k in ("raw", "unchecked", "commlib", "price")}
    for r in rows:
        t = r["torch"]
        for k in ("raw", "unchecked", "commlib"):
            ratio[k].append(r[k] / t)
        ratio["price"].append(r["commlib"] / r["unchecked"])
        print(
            f"| {r['op']} | {r['bytes']} | {r['raw'] * 1e6:.1f} | {r['unchecked'] * 1e6:.1f} | "
            f"{r['commlib'] * 1e6:.1f} | {t * 1e6:.1f} | {r['raw'] / t:.3f} | "
            f"{r['unchecked'] / t:.3f} | {r['commlib'] / t:.3f} | "
            f"{r['commlib'] / r['unchecked']:.2f} | {r['unchecked'] / r['raw']:.2f} |"
        )
    print(
        f"\ngeometric means over {len(rows)} rows: raw/torch {_geomean(ratio['raw']):.3f}, "
        f"unchecked/torch {_geomean(ratio['unchecked']):.3f}, "
        f"checked/torch {_geomean(ratio['commlib']):.3f}, "
        f"check's price {_geomean(ratio['price']):.2f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load": load, "trials": args.trials, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
