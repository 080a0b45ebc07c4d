"""Instructions a call costs before the engine, counted by callgrind: a figure load does not move.

The dispatch cases of ``commlib bench --ops dispatch`` (torch's fake process
group, one process), each side's calls counted by valgrind's callgrind: the
script runs itself under ``valgrind --tool=callgrind --dump-before=getppid``
and calls ``os.getppid()`` around each side's timed calls, so each side's
calls land in a profile part of their own. On a machine others share, wall
and CPU times swing with the load; instruction counts barely move, so an A/B
of two trees (run this in each) compares dispatch-level changes there.

Usage:
    python benchmarks/count_dispatch.py [--nproc 8] [--calls 200] [--ops all_gather,gather]
        [--backend nccl|hccl|cncl|module:Class] [--sides unchecked,observer,recorder]
        [--elements 900]

``--backend`` names the plugin as ``commlib bench --backend`` does (an absent
accelerator over simulated devices); ``--sides`` the commlib sides counted,
as the dispatch kind's (one no-op observer, the flight recorder), and
``checked``: a ``strict=True`` communicator's calls. On the fake group every
rank's slot comes back as this rank's own, so the check passes and what is
counted is its host work (the slot, the header, the comparison, the copy
out), the engine's round being free there:
``python benchmarks/count_dispatch.py --nproc 2 --sides unchecked,checked``.

The collector is off during each side's counted calls (collected just
before), as ``commlib bench`` times them. Needs valgrind on PATH. Each
side: instructions per call (thousands), and commlib's count over torch's.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import re
import subprocess
import sys
import tempfile


def _count(
    nproc: int,
    calls: int,
    ops: list[str],
    order_file: str,
    backend: str | None,
    sides: list[str],
    elements: int | None = None,
) -> None:
    """The counted run (under callgrind): each side's calls between two ``getppid``."""
    from commlib import Communicator
    from commlib.bench import dispatch_cases
    from commlib.bench.dispatch import _Sides
    from commlib.bench.dispatch_cases import select_dispatch
    from commlib.bench.fake_world import dispatch_plugin, fake_world
    from commlib.bench.named_plugin import simulated_if_absent
    from commlib.bench.options import backend_plugin

    if elements is not None:  # the cases read it when they make their tensors
        dispatch_cases.ELEMENTS = elements
    order = []
    base = simulated_if_absent(backend_plugin(backend, dispatch=True))
    observers = _Sides()
    plugin = dispatch_plugin(base)
    with fake_world(nproc, plugin) as comm:
        # the fake group hands every rank's slot back as this rank's: the check passes
        strict = Communicator(backend=plugin, strict=True) if "checked" in sides else None
        for case in select_dispatch([f"{op}[dispatch]" for op in ops]):
            prepared = case.prepare(comm)
            if strict is not None:
                prepared["checked"] = case.prepare(strict)["commlib"]
            for side in ["torch", *sides]:
                call = prepared[side if side in ("torch", "checked") else "commlib"]
                with observers.on(side):
                    for _ in range(20):  # warm: lanes learnt, slots sized
                        call()
                    # the collector off, as `commlib bench` times: a collection that
                    # falls into one side's calls would count there (thousands a call)
                    gc.collect()
                    gc.disable()
                    os.getppid()  # a dump: the part that follows is this side's
                    for _ in range(calls):
                        call()
                    os.getppid()
                    gc.enable()
                order.append((case.op, side))
    with open(order_file, "w") as f:
        json.dump(order, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--ops", default="all_reduce,all_gather,gather")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--sides", default="unchecked")
    parser.add_argument(
        "--elements", type=int, default=None, help="elements of each tensor (the cases' 4)"
    )
    parser.add_argument("--counted", metavar="ORDER_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    ops = args.ops.split(",")
    sides = args.sides.split(",")
    if args.counted:
        _count(args.nproc, args.calls, ops, args.counted, args.backend, sides, args.elements)
        return
    with tempfile.TemporaryDirectory() as where:
        order_file = os.path.join(where, "order.json")
        command = [
            "valgrind",
            "--tool=callgrind",
            "--dump-before=getppid",
            f"--callgrind-out-file={where}/out",
            sys.executable,
            __file__,
            *("--nproc", str(args.nproc), "--calls", str(args.calls), "--ops", args.ops),
            *("--sides", args.sides, "--counted", order_file),
            *(("--backend", args.backend) if args.backend else ()),
            *(("--elements", str(args.elements)) if args.elements is not None else ()),
        ]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        parts = sorted(glob.glob(f"{where}/out.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        totals = []
        for part in parts:
            with open(part) as f:
                found = re.search(r"^summary: (\d+)", f.read(), re.M)
            totals.append(int(found.group(1)) if found else 0)
        with open(order_file) as f:
            order = json.load(f)
    # parts: before the first side, then each side's calls and the gap after them
    per_call = {tuple(side): n / args.calls / 1000 for side, n in zip(order, totals[1::2])}
    print(f"# instructions a call (thousands), fake group of {args.nproc}, {args.calls} calls")
    print(f"# backend {args.backend or 'this machine default'}")
    if args.elements is not None:
        print(f"# {args.elements} elements a tensor")
    for op in ops:
        torch_k = per_call.get((op, "torch"))
        for side in sides:
            ours = per_call.get((op, side))
            if torch_k and ours:
                print(
                    f"{op:24s} {side:9s} torch {torch_k:8.1f}  commlib {ours:8.1f}"
                    f"  {ours / torch_k:5.2f}x"
                )


if __name__ == "__main__":
    main()
