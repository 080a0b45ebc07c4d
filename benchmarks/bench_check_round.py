"""What the argument check's round costs on gloo, against torch's own collectives.

Plain ``torch.distributed``, no commlib, every case interleaved in each trial:
torch's broadcast, scatter and all_to_all_single per size; the check's round
alone (one all_to_all of a slot per rank, as ``all_gather_slots`` sends it) at
several slot sizes; the round a bitwise-OR all_reduce of a fingerprint and its
complement would be (the only way to check with an all_reduce); and the round
with some microseconds of Python spent on each rank before and after it, which
is what a check written in Python adds on a machine whose cores the ranks and
gloo's threads share. Each row: the median call of the slowest rank.

Usage:
    python benchmarks/bench_check_round.py [--nproc 2] [--iters 50] [--trials 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20]
SLOTS = [256, 4096, 65 << 10, 256 << 10]
SPINS = [10, 25]  # microseconds of Python before and after a 4 KiB round


def _spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _cases(rank: int, world: int) -> dict[str, Callable[[], object]]:
    cases: dict[str, Callable[[], object]] = {}
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
    for slot in SLOTS:
        sent = torch.ones(world * slot, dtype=torch.uint8)
        got = torch.empty_like(sent)
        cases[f"check round, {slot >> 10 or slot}{'K' if slot >= 1024 else ' B'} slot"] = (
            lambda s=sent, g=got: dist.all_to_all_single(g, s)
        )
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


def _rank(rank: int, world: int, rendezvous: str, iters: int, trials: int) -> None:
    # a file rendezvous: no port to race other programs for
    dist.init_process_group("gloo", f"file://{rendezvous}", rank=rank, world_size=world)
    cases = _cases(rank, world)
    for call in cases.values():
        for _ in range(3):
            call()
    medians: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(trials):
        for name, call in cases.items():
            times = []
            for _ in range(iters):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            medians[name].append(statistics.median(times))
    row = torch.tensor([statistics.median(m) * 1e6 for m in medians.values()])
    dist.all_reduce(row, dist.ReduceOp.MAX)  # the slowest rank
    if rank == 0:
        print(f"# gloo, {world} ranks, load {os.getloadavg()[0]:.2f} at the end")
        for name, us in zip(medians, row.tolist()):
            print(f"{name:48s} {us:9.1f} us")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        rendezvous = os.path.join(where, "rendezvous")
        mp.spawn(_rank, args=(args.nproc, rendezvous, args.iters, args.trials), nprocs=args.nproc)


if __name__ == "__main__":
    main()
