"""Which of the engine's own collectives is cheapest, per size: the facts behind gloo's paths.

Plain ``torch.distributed`` only, no commlib: each of gloo's collectives
against the composition the gloo plugin uses instead below
``small_exchange_bytes`` (1 MiB gathered in all):

* ``all_gather_into_tensor`` against one ``all_to_all_single`` whose input is
  the tensor once per rank;
* ``all_reduce`` against that all_to_all and a local reduction;
* ``reduce_scatter`` against one ``all_to_all_single`` (each rank its chunk)
  and a local reduction;
* ``reduce`` against ``gather`` to ``dst`` and a local reduction.

Every call starts right after a barrier; each figure is the median call of
the slowest rank, over ``--iters`` calls in each of ``--rounds`` rounds, the
ways taking turns. The ratio is composed / gloo's (below 1: the composition
is faster), with its lowest and highest per-round value.

Usage:
    python benchmarks/bench_engine_paths.py [--nproc 2] [--iters 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as tdist

from commlib.bench.units import format_size
from commlib.testing import World

SIZES = [64, 4096, 65536, 262144, 1 << 20, 4 << 20]
_rs_single = getattr(tdist, "reduce_scatter_single", None) or tdist.reduce_scatter_tensor
_ag_single = getattr(tdist, "all_gather_single", None) or tdist.all_gather_into_tensor


def _pairs(nbytes: int) -> dict:
    """name -> (gloo's own call, the composed call), for one size per rank."""
    world, me = tdist.get_world_size(), tdist.get_rank()
    n = max(1, nbytes // 4)
    x = torch.full((n,), float(me + 1))
    y = x.clone()
    out = torch.empty(world * n)
    repeated = torch.empty(world * n)
    got = torch.empty(world * n)
    chunk = torch.empty(n)
    whole = torch.full((world * n,), float(me + 1))

    def gather_a2a() -> None:
        repeated.view(world, n).copy_(x.expand(world, n))
        tdist.all_to_all_single(got, repeated)

    def all_reduce_a2a() -> None:
        gather_a2a()
        y.copy_(got.view(world, n).sum(0))

    def reduce_scatter_a2a() -> None:
        tdist.all_to_all_single(got, whole)
        torch.sum(got.view(world, n), 0, out=chunk)

    parts = [torch.empty(n) for _ in range(world)] if me == 0 else None

    def reduce_gather() -> None:
        tdist.gather(x, parts, dst=0)
        if parts is not None:
            y.copy_(torch.stack(parts).sum(0))

    return {
        "all_gather_into_tensor": (lambda: _ag_single(out, x), gather_a2a),
        "all_reduce": (lambda: tdist.all_reduce(y), all_reduce_a2a),
        "reduce_scatter": (lambda: _rs_single(chunk, whole), reduce_scatter_a2a),
        "reduce": (lambda: tdist.reduce(y, dst=0), reduce_gather),
    }


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return float(t)


def _on_measure(comm, iters: int, rounds: int) -> dict:
    out: dict = {}
    for nbytes in SIZES:
        n_iters = iters if nbytes <= 1 << 18 else max(5, iters // 10)
        for name, (own, composed) in _pairs(nbytes).items():
            for fn in (own, composed):
                fn()
            per_round = []
            for _ in range(rounds):
                samples: dict[str, list[float]] = {"own": [], "composed": []}
                for i in range(n_iters):
                    order = (("own", own), ("composed", composed))
                    for key, fn in order if i % 2 == 0 else order[::-1]:
                        tdist.barrier()
                        start = time.perf_counter()
                        fn()
                        samples[key].append(time.perf_counter() - start)
                per_round.append({k: _slowest(statistics.median(v)) for k, v in samples.items()})
            out[(name, nbytes)] = per_round
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with World(args.nproc, timeout=600) as world:
        result = world.run(_on_measure, args.iters, args.rounds, timeout=3000)[0]
    print(f"# gloo, {args.nproc} ranks, torch {torch.__version__}: median ms per call")
    print("| op | bytes per rank | gloo's own | composed | composed / own | spread |")
    print("|---|---:|---:|---:|---:|---|")
    for (name, nbytes), rounds in result.items():
        own = statistics.median(r["own"] for r in rounds) * 1e3
        composed = statistics.median(r["composed"] for r in rounds) * 1e3
        ratios = [r["composed"] / r["own"] for r in rounds]
        print(
            f"| {name} | {format_size(nbytes)} | {own:.3f} | {composed:.3f} | "
            f"{composed / own:.2f} | {min(ratios):.2f}-{max(ratios):.2f} |"
        )


if __name__ == "__main__":
    main()
