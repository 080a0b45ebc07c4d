"""What the argument check's round costs on gloo, against torch's own collectives.

Plain ``torch.distributed``, no commlib, every case interleaved in each trial:
torch's broadcast, scatter and all_to_all_single per size; the check's round
alone (one all_to_all of a slot per rank, as ``all_gather_slots`` sends it) at
several slot sizes; the round a bitwise-OR all_reduce of a fingerprint and its
complement would be (the only way to check with an all_reduce); and the round
with some microseconds of Python spent on each rank before and after it, which
is what a check written in Python adds on a machine whose cores the ranks and
gloo's threads share; and the same rounds through shared memory, as commlib
takes them where every rank runs on one machine (:mod:`commlib._shared_rows`),
alone and before each size's broadcast. Each row: the median call of the
slowest rank; ``--barrier`` puts a barrier before every timed call, as
``commlib bench`` does, so a rank late from the last call is not billed.

Usage:
    python benchmarks/bench_check_round.py [--nproc 2] [--iters 50] [--trials 5] [--barrier]
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from commlib import _shared_rows

SIZES = [1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20]
SLOTS = [256, 4096, 65 << 10, 256 << 10]
SPINS = [10, 25]  # microseconds of Python before and after a 4 KiB round


def _spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _segment(rank: int, world: int, where: str) -> _shared_rows.SharedRows:
    """The ranks' shared rows: rank 0 sizes the file, every rank maps it (after a barrier)."""
    path = os.path.join(where, "rows")
    size = _shared_rows._data_at(world) + 2 * world * _shared_rows._area_for(world)
    if rank == 0:
        with open(path, "wb") as f:
            f.truncate(size)
    dist.barrier()
    with open(path, "r+b") as f:
        buffer = mmap.mmap(f.fileno(), size)
    return _shared_rows.SharedRows(buffer, world, rank, [None] * world)


def _cases(rank: int, world: int, where: str) -> dict[str, Callable[[], object]]:
    cases: dict[str, Callable[[], object]] = {}
    rows = _segment(rank, world, where)
    for nbytes in SIZES:
        n = nbytes // 4 // world * world
        x, out = torch.ones(n), torch.empty(n)
        piece = torch.empty(n // world)
        parts = [torch.ones(n // world) for _ in range(world)] if rank == 0 else None
        cases[f"torch broadcast {nbytes >> 10}K"] = lambda x=x: dist.broadcast(x, 0)
        cases[f"torch scatter {nbytes >> 10}K"] = lambda p=piece, s=parts: dist.scatter(p, s, 0)
        cases[f"torch all_to_all_single {nbytes >> 10}K"] = lambda x=x, o=out: (
            dist.all_to_all_single(o, x)
        )
        row = torch.ones(4096, dtype=torch.uint8)
        every = torch.empty(world * 4096, dtype=torch.uint8)
        one_row = rows.lane(4096, False)
        cases[f"shared 4K round + torch broadcast {nbytes >> 10}K"] = (
            lambda x=x, r=row, e=every, lane=one_row: (
                lane.call(e, r, None).wait(),
                dist.broadcast(x, 0),
            )
        )
    for slot in SLOTS:
        sent = torch.ones(world * slot, dtype=torch.uint8)
        got = torch.empty_like(sent)
        label = f"{slot >> 10 or slot}{'K' if slot >= 1024 else ' B'} slot"
        cases[f"check round, {label}"] = lambda s=sent, g=got: dist.all_to_all_single(g, s)
        apart = rows.lane(slot, True)
        if apart is not None:
            rows_apart = sent.view(world, slot)
            cases[f"shared round, {label}"] = lambda a=apart, r=rows_apart, g=got: a.call(
                g, r, [], [], None
            ).wait()
    both = torch.tensor([0x1234, ~0x1234], dtype=torch.int64)
    cases["BOR all_reduce of [fp, ~fp]"] = lambda: dist.all_reduce(both, dist.ReduceOp.BOR)
    sent = torch.ones(world * 4096, dtype=torch.uint8)
    got = torch.empty_like(sent)
    for us in SPINS:
        cases[f"4K round + {us} us Python before and after"] = lambda us=us: (
            _spin(us),
            dist.all_to_all_single(got, sent),
            _spin(us),
        )
    return cases


def _rank(rank: int, world: int, rendezvous: str, iters: int, trials: int, barrier: bool) -> None:
    # a file rendezvous: no port to race other programs for
    dist.init_process_group("gloo", f"file://{rendezvous}", rank=rank, world_size=world)
    cases = _cases(rank, world, os.path.dirname(rendezvous))
    for call in cases.values():
        for _ in range(3):
            call()
    medians: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(trials):
        for name, call in cases.items():
            times = []
            for _ in range(iters):
                if barrier:
                    dist.barrier()
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            medians[name].append(statistics.median(times))
    row = torch.tensor([statistics.median(m) * 1e6 for m in medians.values()])
    dist.all_reduce(row, dist.ReduceOp.MAX)  # the slowest rank
    if rank == 0:
        how = ", a barrier before each call" if barrier else ""
        print(f"# gloo, {world} ranks{how}, load {os.getloadavg()[0]:.2f} at the end")
        for name, us in zip(medians, row.tolist()):
            print(f"{name:48s} {us:9.1f} us")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--barrier", action="store_true", help="a barrier before each call")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        rendezvous = os.path.join(where, "rendezvous")
        spawned = (args.nproc, rendezvous, args.iters, args.trials, args.barrier)
        mp.spawn(_rank, args=spawned, nprocs=args.nproc)


if __name__ == "__main__":
    main()
