"""What strict mode costs: all_reduce / broadcast with and without it, against torch.

Strict mode agrees on a fingerprint (one 8-byte all_gather) before each
collective. This measures that price at a few sizes, in the same run as plain
``torch.distributed`` and commlib without strict mode.

Usage:
    python benchmarks/bench_strict.py [--nproc 2] [--iters 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as tdist

from commlib import Communicator
from commlib.testing import World

SIZES = [8, 4096, 1 << 20, 16 << 20]


def _time(fn, iters: int) -> float:
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _on_measure(comm, iters: int) -> dict:
    loose = Communicator(timeout=120)
    strict = Communicator(timeout=120, strict=True)
    out = {}
    for nbytes in SIZES:
        x = torch.ones(max(1, nbytes // 4))
        n = max(5, iters if nbytes <= 1 << 20 else iters // 20)
        cases = {
            "torch": lambda x=x: tdist.all_reduce(x),
            "commlib": lambda x=x: loose.all_reduce(x),
            "commlib strict": lambda x=x: strict.all_reduce(x),
        }
        for name, fn in cases.items():
            fn()
            tdist.barrier()
            out[(nbytes, name)] = _time(fn, n)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    with World(args.nproc, timeout=600) as world:
        per_rank = world.run(_on_measure, args.iters)
    slowest = {k: max(r[k] for r in per_rank) for k in per_rank[0]}
    print(f"all_reduce, gloo, {args.nproc} ranks, median of iterations, slowest rank")
    print(
        f"{'bytes':>10} {'torch us':>10} {'commlib us':>11} {'strict us':>10} "
        f"{'commlib/torch':>14} {'strict/torch':>13} {'strict cost us':>15}"
    )
    for nbytes in SIZES:
        t, c, s = (slowest[(nbytes, k)] * 1e6 for k in ("torch", "commlib", "commlib strict"))
        print(
            f"{nbytes:>10} {t:>10.1f} {c:>11.1f} {s:>10.1f} {c / t:>14.2f} {s / t:>13.2f} "
            f"{s - c:>15.1f}"
        )


if __name__ == "__main__":
    main()
