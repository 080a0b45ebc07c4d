"""commlib on MPI against raw mpi4py, torch.distributed on gloo, and commlib on gloo.

Run under MPI's launcher (it is the mpi backend's; needs ``pip install 'commlib[mpi]'``):

    mpiexec -n 2 python benchmarks/bench_mpi.py [--trials 7] [--json out.json]

All sides run in the same ranks, interleaved call by call in each trial (a
barrier before every call), so drift hits them alike. Per (collective, size):

* ``raw``: mpi4py's blocking call on the tensor's memory (what the layer adds to);
* ``commlib``: ``commlib.all_reduce(t)`` and friends on the mpi backend (checked,
  the default), and ``unchecked`` (``strict=False``);
* ``torch-gloo``: ``torch.distributed`` on a gloo group of the same ranks
  (what a CPU user runs otherwise);

and for the object collectives with 64 MiB payloads (a dict of numpy arrays),
commlib on mpi against commlib on gloo. A figure is the median over the
trials of the slowest rank's median call; rank 0 prints the table and the
load average.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

import commlib
from commlib import Communicator

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
OBJECT_BYTES = 64 << 20


def _iters(nbytes: int) -> int:
    return 20 if nbytes <= 1 << 20 else 5


def _tensor_sides(comm: Communicator, unchecked: Communicator, gloo, op: str, nbytes: int):
    from mpi4py import MPI

    raw_comm = comm.plugin.comm_of(comm.group)
    n, rank = comm.world_size, comm.rank
    count = nbytes // 4
    bufs = {s: torch.full((count,), float(rank + 1)) for s in ("raw", "c", "u", "g")}
    outs = {s: torch.empty(n * count) for s in ("raw", "c", "u", "g")}
    a = bufs["raw"].numpy()
    o = outs["raw"].numpy()
    if op == "all_reduce":
        return {
            "raw": lambda: raw_comm.Allreduce(MPI.IN_PLACE, a, MPI.SUM),
            "commlib": lambda: comm.all_reduce(bufs["c"]),
            "unchecked": lambda: unchecked.all_reduce(bufs["u"]),
            "torch-gloo": lambda: dist.all_reduce(bufs["g"], group=gloo),
        }
    if op == "broadcast":
        return {
            "raw": lambda: raw_comm.Bcast(a, 0),
            "commlib": lambda: comm.broadcast(bufs["c"], src=0),
            "unchecked": lambda: unchecked.broadcast(bufs["u"], src=0),
            "torch-gloo": lambda: dist.broadcast(bufs["g"], src=0, group=gloo),
        }
    return {
        "raw": lambda: raw_comm.Allgather(a, o),
        "commlib": lambda: comm.all_gather_into_tensor(outs["c"], bufs["c"]),
        "unchecked": lambda: unchecked.all_gather_into_tensor(outs["u"], bufs["u"]),
        "torch-gloo": lambda: dist.all_gather_into_tensor(outs["g"], bufs["g"], group=gloo),
    }


def _object_sides(comm: Communicator, on_gloo: Communicator, op: str):
    rank = comm.rank
    payload = {f"a{i}": np.full(OBJECT_BYTES // 8 // 4, rank, dtype=np.float64) for i in range(4)}
    if op == "broadcast_object":
        return {
            "commlib": lambda: comm.broadcast_object(payload if rank == 0 else None, src=0),
            "commlib-gloo": lambda: on_gloo.broadcast_object(
                payload if rank == 0 else None, src=0
            ),
        }
    return {
        "commlib": lambda: comm.all_gather_object(payload),
        "commlib-gloo": lambda: on_gloo.all_gather_object(payload),
    }


def _measure(comm: Communicator, calls: dict, iters: int, trials: int) -> dict[str, float]:
    """Median over trials of the slowest rank's median call, per side (seconds)."""
    names = list(calls)
    for fn in calls.values():  # warm up: first calls allocate and connect
        fn()
    per_trial: dict[str, list[float]] = {s: [] for s in names}
    for trial in range(trials):
        times: dict[str, list[float]] = {s: [] for s in names}
        for i in range(iters):
            order = names[(i + trial) % len(names) :] + names[: (i + trial) % len(names)]
            for side in order:
                comm.barrier()
                start = time.perf_counter()
                calls[side]()
                times[side].append(time.perf_counter() - start)
        mine = torch.tensor([statistics.median(times[s]) for s in names], dtype=torch.float64)
        comm.all_reduce(mine, op="max")
        for side, t in zip(names, mine.tolist()):
            per_trial[side].append(t)
    return {s: statistics.median(per_trial[s]) for s in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    commlib.init_dist("mpi", backend="mpi", timeout=300)
    comm = commlib.get_communicator()
    unchecked = Communicator(comm.group, strict=False, timeout=comm.timeout)
    gloo = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=300))
    on_gloo = Communicator(gloo, timeout=comm.timeout)
    rows = []
    for op in ("all_reduce", "broadcast", "all_gather_into_tensor"):
        for nbytes in SIZES:
            calls = _tensor_sides(comm, unchecked, gloo, op, nbytes)
            rows.append(
                {"op": op, "bytes": nbytes, **_measure(comm, calls, _iters(nbytes), args.trials)}
            )
    for op in ("broadcast_object", "all_gather_object"):
        calls = _object_sides(comm, on_gloo, op)
        rows.append({"op": op, "bytes": OBJECT_BYTES, **_measure(comm, calls, 3, args.trials)})
    if comm.rank == 0:
        load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else []
        print(f"# {comm.world_size} ranks, {args.trials} trials; load average {' '.join(load)}")
        print(
            "| op | size | raw mpi4py (us) | commlib (us) | unchecked (us) | commlib / raw | "
            "unchecked / raw | torch gloo (us) | torch gloo / commlib |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            size = f"{r['bytes'] >> 10}K" if r["bytes"] < 1 << 20 else f"{r['bytes'] >> 20}M"
            if "raw" in r:
                print(
                    f"| {r['op']} | {size} | {r['raw'] * 1e6:.1f} | {r['commlib'] * 1e6:.1f} | "
                    f"{r['unchecked'] * 1e6:.1f} | {r['commlib'] / r['raw']:.2f} | "
                    f"{r['unchecked'] / r['raw']:.2f} | {r['torch-gloo'] * 1e6:.1f} | "
                    f"{r['torch-gloo'] / r['commlib']:.1f} |"
                )
        print("\n| object op (64 MiB) | commlib mpi (ms) | commlib gloo (ms) | gloo / mpi |")
        print("|---|---:|---:|---:|")
        for r in rows:
            if "commlib-gloo" in r:
                print(
                    f"| {r['op']} | {r['commlib'] * 1e3:.1f} | {r['commlib-gloo'] * 1e3:.1f} | "
                    f"{r['commlib-gloo'] / r['commlib']:.1f} |"
                )
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"load": load, "trials": args.trials, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
