"""The mpi plugin's waits, hot and yielding, in turn in the same ranks: ``commlib bench`` rows.

Small MPI waits yield the core between their tests
(:data:`commlib_backends.mpi_group._YIELD_BELOW`, ``mpi_lanes.SPINS`` /
``YIELDS``); before, they tested back to back (48 tests, then a millisecond
spinning). This runs ``commlib bench``'s own cases and timing
(:func:`commlib.bench.timing.measure`: checked, unchecked and torch on gloo
interleaved, a barrier before every call) with either way in turn, round by
round, so the machine's drift hits both alike.

Usage (2 ranks):

    mpiexec -n 2 python benchmarks/mpi_waits.py [--rounds 4]
        [--cases all_reduce:1K,broadcast:256K,...]

Prints each case's checked / unchecked / torch time (us, the slowest rank's
median over 5 trials) per round for each way, and their geometric means.
"""

from __future__ import annotations

import argparse
import math
import os

import numpy as np
import torch

import commlib
import commlib_backends.mpi as mpi_plugin
import commlib_backends.mpi_group as mpi_group
import commlib_backends.mpi_lanes as mpi_lanes
from commlib.bench import timing
from commlib.bench.cases import select_cases
from commlib.bench.runner import baseline, prepare_sides, sides
from commlib.bench.units import parse_size

CASES = (
    "all_reduce:1K,all_gather_into_tensor:4K,broadcast:1K,reduce_scatter:4K,"
    "all_to_all_single:1K,all_reduce:64K,broadcast:256K,all_gather_into_tensor:1M"
)


def _use(spins: range, yields: range, below: int) -> None:
    mpi_plugin.SPINS = mpi_lanes.SPINS = spins
    mpi_plugin.YIELDS = mpi_lanes.YIELDS = yields
    mpi_group._YIELD_BELOW = below


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cases", default=CASES)
    args = parser.parse_args()
    commlib.init_dist("mpi")
    comm = commlib.get_communicator()
    ways = {
        "hot": (range(48), range(0), 0),
        "yielding": (mpi_lanes.SPINS, mpi_lanes.YIELDS, mpi_group._YIELD_BELOW),
    }
    comms = sides(comm, "both")
    torch_side = baseline(comm)
    cases = []
    for spec in args.cases.split(","):
        name, size = spec.split(":")
        cases += [(case, parse_size(size)) for case in select_cases(name)]
    got: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for way in list(ways) if r % 2 == 0 else list(ways)[::-1]:
            _use(*ways[way])
            for case, size in cases:
                prepared = prepare_sides(case, comms, size, torch_side)
                m = timing.measure(prepared, 10, 3, comm.group, comm.plugin.synchronize, 5)
                worst = {}
                for impl in m.impls():
                    t = torch.tensor(m.trial_medians(impl), dtype=torch.float64)
                    commlib.all_reduce(t, "max", group=comm)
                    worst[impl] = float(np.median(t.numpy())) * 1e6
                got.setdefault((way, case.name, size), []).append(worst)
    if comm.rank != 0:
        return
    print(f"load {os.getloadavg()[0]:.1f}; checked / unchecked / torch us, round by round")
    for key in sorted(got, key=lambda k: (k[1], k[2], k[0])):
        rounds = "  ".join(
            f"{x['commlib']:7.1f}/{x['unchecked']:7.1f}/{x['torch']:7.1f}" for x in got[key]
        )
        print(f"{key[0]:8} {key[1]:24} {key[2]:8} | {rounds}")
    for way in ways:
        rows = [x for k, v in got.items() if k[0] == way for x in v]
        mean = {s: _geomean([x[s] for x in rows]) for s in ("commlib", "unchecked", "torch")}
        price = _geomean([x["commlib"] / x["unchecked"] for x in rows])
        print(
            f"{way}: geometric mean checked {mean['commlib']:.1f} us, unchecked "
            f"{mean['unchecked']:.1f}, torch {mean['torch']:.1f}; price {price:.2f}"
        )


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


if __name__ == "__main__":
    main()
