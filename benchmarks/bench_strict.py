"""What the argument check costs, per size: all_reduce and broadcast, checked and not.

Four ways, in the same run, on the same data: plain ``torch.distributed``;
commlib with the check off (``strict=False``, the opt-out for hot loops);
commlib's default (on gloo the tensor collectives are checked: the data
travels with the check when it fits the 4 KiB slot, otherwise the check is
one small round before the engine's collective); and strict mode. Sizes span
the slot: just inside it, just past it, and up to 16 MiB.

Usage:
    python benchmarks/bench_strict.py [--nproc 2] [--iters 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as tdist

from commlib import Communicator
from commlib.testing import World

SIZES = [8, 1024, 4000, 8192, 65536, 1 << 20, 16 << 20]
WAYS = ("torch", "unchecked", "default", "strict")


def _time(fn, iters: int) -> float:
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _calls(comm, op: str, x: torch.Tensor) -> dict:
    comms = {
        "unchecked": Communicator(timeout=300, strict=False),
        "default": Communicator(timeout=300),
        "strict": Communicator(timeout=300, strict=True),
    }
    if op == "all_reduce":
        out = {"torch": lambda: tdist.all_reduce(x)}
        out.update({k: (lambda c=c: c.all_reduce(x)) for k, c in comms.items()})
    else:
        out = {"torch": lambda: tdist.broadcast(x, src=0)}
        out.update({k: (lambda c=c: c.broadcast(x, src=0)) for k, c in comms.items()})
    return out


def _on_measure(comm, iters: int, rounds: int) -> dict:
    out: dict = {}
    for op in ("all_reduce", "broadcast"):
        for nbytes in SIZES:
            x = torch.ones(max(1, nbytes // 4))
            n = max(5, iters if nbytes <= 1 << 16 else iters // 20)
            calls = _calls(comm, op, x)
            # the ways take turns, so a busy moment on the machine hits them alike
            runs: dict = {way: [] for way in WAYS}
            for _ in range(rounds):
                for way in WAYS:
                    calls[way]()
                    tdist.barrier()
                    runs[way].append(_time(calls[way], n))
            for way in WAYS:
                out[(op, nbytes, way)] = statistics.median(runs[way])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with World(args.nproc, timeout=1800) as world:
        per_rank = world.run(_on_measure, args.iters, args.rounds, timeout=1800)
    slowest = {k: max(r[k] for r in per_rank) for k in per_rank[0]}
    print(f"gloo, {args.nproc} ranks, median time per call (us), slowest rank")
    head = f"{'op':<11} {'bytes':>9} " + " ".join(f"{w:>10}" for w in WAYS)
    print(head + f" {'check cost':>11} {'default/unchecked':>18}")
    for op in ("all_reduce", "broadcast"):
        for nbytes in SIZES:
            t = {w: slowest[(op, nbytes, w)] * 1e6 for w in WAYS}
            print(
                f"{op:<11} {nbytes:>9} "
                + " ".join(f"{t[w]:>10.1f}" for w in WAYS)
                + f" {t['default'] - t['unchecked']:>11.1f} "
                f"{t['default'] / t['unchecked']:>18.2f}"
            )


if __name__ == "__main__":
    main()
