"""What observing collectives costs per call: no observer, the flight recorder, one observer.

Two measurements, each configuration interleaved with the others in rounds so
that a busy machine slows them alike; each figure is the fastest round's
time per call:

* in one process (``single`` backend, where the collective itself costs almost
  nothing), the time of one ``all_reduce`` call: the method without the
  observer wrapper, with it and nothing registered, with the flight
  recorder, with one (empty) third-party observer, with the same observer
  asking for call sites, with the statistics;
* on gloo (``--nproc`` ranks), a small ``all_reduce`` through plain
  ``torch.distributed``, through commlib, and through commlib with the flight
  recorder or one observer.

Usage:
    python benchmarks/bench_observe.py [--nproc 2] [--rounds 30] [--calls 2000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.distributed as tdist

from commlib import Communicator, hookimpl
from commlib.observe import CollectiveStats, FlightRecorder
from commlib.plugins import plugin_manager
from commlib.testing import World


class EmptyObserver:
    """The cheapest possible third-party observer: both hooks, doing nothing."""

    @hookimpl
    def commlib_collective_start(self, event):
        pass

    @hookimpl
    def commlib_collective_end(self, event):
        pass


class SiteObserver(EmptyObserver):
    """The same, asking for each collective's call site (the stack walk it costs)."""

    commlib_call_sites = True


def _configurations(comm: Communicator, x: torch.Tensor) -> dict[str, tuple]:
    """name -> (plugin to register or None, the call)."""
    bare = Communicator.all_reduce.__wrapped__  # type: ignore[attr-defined]
    return {
        "method without the wrapper": (None, lambda: bare(comm, x)),
        "no observer": (None, lambda: comm.all_reduce(x)),
        "flight recorder": (FlightRecorder(), lambda: comm.all_reduce(x)),
        "one observer": (EmptyObserver(), lambda: comm.all_reduce(x)),
        "one observer + call sites": (SiteObserver(), lambda: comm.all_reduce(x)),
        "statistics": (CollectiveStats(), lambda: comm.all_reduce(x)),
    }


def _per_call(call: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls


def _interleaved(configs: dict[str, tuple], rounds: int, calls: int, sync=None) -> dict:
    samples: dict[str, list[float]] = {name: [] for name in configs}
    pm = plugin_manager()
    for _ in range(rounds):
        for name, (plugin, call) in configs.items():
            if plugin is not None:
                pm.register(plugin)
            call()  # the first call after a registration change looks observers up
            if sync is not None:
                sync()
            samples[name].append(_per_call(call, calls))
            if plugin is not None:
                pm.unregister(plugin)
    # the fastest round: what a call costs when the shared machine lets it run
    return {name: min(s) for name, s in samples.items()}


def in_one_process(rounds: int, calls: int) -> dict[str, float]:
    comm = Communicator()
    return _interleaved(_configurations(comm, torch.ones(4)), rounds, calls)


def _on_gloo(comm, rounds: int, calls: int) -> dict[str, float]:
    c = Communicator(timeout=300)
    x = torch.ones(4)
    configs = {"torch.distributed": (None, lambda: tdist.all_reduce(x))}
    configs.update(_configurations(c, x))
    del configs["method without the wrapper"], configs["statistics"]
    return _interleaved(configs, rounds, calls, sync=tdist.barrier)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()

    local = in_one_process(args.rounds, args.calls)
    base = local["method without the wrapper"]
    print("all_reduce of 4 floats, one process (single backend), fastest round")
    print(f"{'configuration':<28} {'us/call':>8} {'added us':>9}")
    for name, secs in local.items():
        print(f"{name:<28} {secs * 1e6:>8.2f} {(secs - base) * 1e6:>9.2f}")

    gloo_calls = max(20, args.calls // 20)
    with World(args.nproc, timeout=900) as world:
        per_rank = world.run(_on_gloo, args.rounds, gloo_calls)
    slowest = {k: max(r[k] for r in per_rank) for k in per_rank[0]}
    torch_t = slowest["torch.distributed"]
    print()
    print(f"all_reduce of 4 floats, gloo, {args.nproc} ranks, fastest round, slowest rank")
    print(f"{'configuration':<28} {'us/call':>8} {'vs torch':>9} {'vs commlib us':>14}")
    for name, secs in slowest.items():
        added = (secs - slowest["no observer"]) * 1e6
        print(f"{name:<28} {secs * 1e6:>8.1f} {secs / torch_t:>9.2f} {added:>14.1f}")


if __name__ == "__main__":
    main()
