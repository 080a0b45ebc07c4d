"""Instructions a call costs on the mpi backend, checked and unchecked, counted by callgrind.

Two ranks under ``mpiexec``; rank 0 runs under valgrind's callgrind
(``--dump-before=getppid``), rank 1 plainly, so rank 0's count is its own
work: MPI's own call (``raw``, mpi4py on the tensor's memory), commlib
checked (the default: the argument check's round) and unchecked
(``strict=False``). Each side's calls sit between two ``os.getppid()``
calls, so each lands in a profile part of its own. Instruction counts barely
move with the machine's load, so an A/B of two trees compares changes there
(wall time on a shared machine does not).

Usage:
    python benchmarks/count_mpi.py [--calls 100] [--ops all_reduce,broadcast] [--sizes 4K,64K]

Needs valgrind on PATH and ``mpiexec`` beside ``sys.executable`` (or on PATH).
Prints, per op and size, thousands of instructions a call for each side and
the check's price (checked over unchecked).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

#: calls counted between two dumps; each side's figure is its least part's
CHUNK = 10

OPS = (
    "all_reduce,broadcast,reduce,all_gather_into_tensor,reduce_scatter,scatter,"
    "all_to_all_single,gather,all_gather"
)


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _sides(comm, unchecked, op: str, nbytes: int) -> dict:
    import torch
    from mpi4py import MPI

    raw = comm.plugin.comm_of(comm.group)
    n, rank = comm.world_size, comm.rank
    count = max(nbytes // 4, n)
    count -= count % n
    ins = {s: torch.full((count,), float(rank + 1)) for s in ("raw", "c", "u")}
    outs = {s: torch.empty(n * count) for s in ("raw", "c", "u")}
    parts = {s: torch.empty(count // n) for s in ("raw", "c", "u")}
    a, o, p = ins["raw"].numpy(), outs["raw"].numpy(), parts["raw"].numpy()
    sides = {"checked": comm, "unchecked": unchecked}
    key = {"checked": "c", "unchecked": "u"}

    def each(call):
        return {side: call(c, key[side]) for side, c in sides.items()}

    if op == "all_reduce":
        return {
            "raw": lambda: raw.Allreduce(MPI.IN_PLACE, a, MPI.SUM),
            **each(lambda c, k: lambda: c.all_reduce(ins[k])),
        }
    if op == "broadcast":
        return {
            "raw": lambda: raw.Bcast(a, 0),
            **each(lambda c, k: lambda: c.broadcast(ins[k], src=0)),
        }
    if op == "reduce":
        return {
            "raw": lambda: raw.Reduce(MPI.IN_PLACE if rank == 0 else a, a, MPI.SUM, 0),
            **each(lambda c, k: lambda: c.reduce(ins[k], dst=0)),
        }
    if op == "all_gather_into_tensor":
        return {
            "raw": lambda: raw.Allgather(a, o),
            **each(lambda c, k: lambda: c.all_gather_into_tensor(outs[k], ins[k])),
        }
    if op == "reduce_scatter":
        return {
            "raw": lambda: raw.Reduce_scatter_block(a, p, MPI.SUM),
            **each(lambda c, k: lambda: c.reduce_scatter(parts[k], ins[k])),
        }
    if op == "scatter":
        return {
            "raw": lambda: raw.Scatter(a if rank == 0 else None, p, 0),
            **each(
                lambda c, k: (
                    lambda: c.scatter(
                        parts[k], list(ins[k].chunk(n)) if rank == 0 else None, src=0
                    )
                )
            ),
        }
    if op == "all_to_all_single":
        return {
            "raw": lambda: raw.Alltoall(a, o[:count]),
            **each(lambda c, k: lambda: c.all_to_all_single(outs[k][:count], ins[k])),
        }
    if op == "gather":
        return {
            "raw": lambda: raw.Gather(a, o if rank == 0 else None, 0),
            **each(lambda c, k: lambda: c.gather(ins[k], dst=0)),
        }
    if op == "all_gather":
        return {
            "raw": lambda: raw.Allgather(a, o),
            **each(lambda c, k: lambda: c.all_gather(ins[k])),
        }
    raise ValueError(f"no case for {op!r}")


def _count(calls: int, ops: list[str], sizes: list[str], order_file: str) -> None:
    """The counted run, in each rank: each side's calls between two ``getppid``."""
    import commlib
    from commlib import Communicator

    commlib.init_dist("mpi", backend="mpi", timeout=600)
    comm = commlib.get_communicator()
    unchecked = Communicator(comm.group, strict=False, timeout=comm.timeout)
    order = []
    for op in ops:
        for size in sizes:
            for side, call in _sides(comm, unchecked, op, _size(size)).items():
                for _ in range(20):  # warm: lanes learnt, slots sized
                    call()
                comm.barrier()
                # parts of CHUNK calls each, between dumps: the least of them is this
                # rank's own work (a part where the other rank was descheduled counts
                # this rank's polls too: on a loaded machine, most of the spread)
                for _ in range(max(calls // CHUNK, 1)):
                    os.getppid()  # a dump: the part that follows is this side's
                    for _ in range(CHUNK):
                        call()
                    os.getppid()
                    order.append((op, size, side))
    if comm.rank == 0:
        with open(order_file, "w") as f:
            json.dump(order, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--ops", default=OPS)
    parser.add_argument("--sizes", default="4K,64K")
    parser.add_argument("--counted", metavar="ORDER_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    ops, sizes = args.ops.split(","), args.sizes.split(",")
    if args.counted:
        _count(args.calls, ops, sizes, args.counted)
        return
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        mpiexec = shutil.which("mpiexec") or "mpiexec"
    with tempfile.TemporaryDirectory() as where:
        order_file = os.path.join(where, "order.json")
        script = [sys.executable, __file__, "--calls", str(args.calls)]
        script += ["--ops", args.ops, "--sizes", args.sizes, "--counted", order_file]
        valgrind = ["valgrind", "--tool=callgrind", "--dump-before=getppid"]
        valgrind.append(f"--callgrind-out-file={where}/out")
        command = [mpiexec, "-n", "1", *valgrind, *script, ":", "-n", "1", *script]
        done = subprocess.run(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        if done.returncode:
            sys.exit(f"the counted run failed ({done.returncode}):\n{done.stderr[-3000:]}")
        parts = sorted(glob.glob(f"{where}/out.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        totals = []
        for part in parts:
            with open(part) as f:
                found = re.search(r"^summary: (\d+)", f.read(), re.M)
            totals.append(int(found.group(1)) if found else 0)
        with open(order_file) as f:
            order = json.load(f)
    # parts: before the first side, then each side's calls and the gap after them
    per_call: dict[tuple[str, ...], float] = {}
    for side, n in zip(order, totals[1::2]):
        found = per_call.get(tuple(side))
        this = n / CHUNK / 1000
        per_call[tuple(side)] = this if found is None else min(found, this)
    print(
        f"# instructions a call (thousands), mpi, rank 0 of 2, {args.calls} calls: "
        f"the least of parts of {CHUNK}"
    )
    print(f"{'op':24s} {'size':>5s} {'raw':>8s} {'checked':>8s} {'unchecked':>9s}  price")
    prices = []
    for op in ops:
        for size in sizes:
            raw, checked, plain = (
                per_call.get((op, size, s)) for s in ("raw", "checked", "unchecked")
            )
            if raw and checked and plain:
                prices.append(checked / plain)
                print(
                    f"{op:24s} {size:>5s} {raw:8.1f} {checked:8.1f} {plain:9.1f}  "
                    f"{checked / plain:5.2f}x"
                )
    if prices:
        mean = math.exp(sum(map(math.log, prices)) / len(prices))
        print(f"geometric mean of the check's price: {mean:.2f}x over {len(prices)} rows")


if __name__ == "__main__":
    main()
