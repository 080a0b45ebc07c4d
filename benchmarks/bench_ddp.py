"""A DDP training step on plain gloo against the same step through commlib, in one run.

Starts a local gloo world (:class:`commlib.testing.World`) and, in its ranks,
one group per variant: ``gloo`` (torch's own), ``commlib`` (``commlib-gloo``,
its default check: gloo's tensor collectives are checked) and ``unchecked``
(``commlib-gloo`` with ``strict=False``). Per model, each variant wraps its
own copy of the model in DDP; trials go round the variants in turn (the
order rotating from one trial to the next), so all see the same machine.
Each trial times ``--steps`` steps (forward, backward with DDP's gradient
all_reduces, optimizer step) after a barrier, on every rank; the slowest
rank's time counts.

Per model and variant it prints the median step time over trials, the
ratio to plain gloo's median, and the spread of the per-trial ratios
(each trial's variant time over the gloo time of the same trial: min-max).

Models: ``mlp`` (a small MLP, 26K parameters: the collectives' fixed cost
shows) and ``25m`` (4 layers of 2500 x 2500, 25M parameters: the bytes do).

It cannot hang silently: a rank that makes no progress for ``--stall-after``
seconds (one trial, or the teardown of a model's groups) prints every
thread's stack and exits, and the benchmark fails naming it. Each model's
DDP copies are dropped before their groups are destroyed: the other way
round, DDP's reducer frees the plain gloo group's last reference while
holding the GIL, and gloo's worker thread, still dropping a finished
work's tensors, waits for the GIL for ever (a run of both models stalled
so with its ranks idle; torch's own bug, met by plain gloo alone).

Usage::

    python benchmarks/bench_ddp.py                       # 2 ranks, both models
    python benchmarks/bench_ddp.py --size 4 --trials 30
    python benchmarks/bench_ddp.py --models mlp --trials 5 --steps 5   # a short look

Examples:
    >>> main(["--models", "mlp", "--trials", "2", "--steps", "2"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import faulthandler
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from commlib.testing import World
from commlib.torch_backend import communicator_of

VARIANTS = ("gloo", "commlib", "unchecked")


def _model(name: str) -> nn.Module:
    if name == "mlp":
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 32))
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(2500, 2500), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _batch(name: str) -> torch.Tensor:
    return torch.randn(32, 64) if name == "mlp" else torch.randn(8, 2500)


def _groups() -> dict[str, Any]:
    groups = {"gloo": dist.new_group(backend="gloo")}
    groups["commlib"] = dist.new_group(backend="commlib-gloo")
    groups["unchecked"] = dist.new_group(backend="commlib-gloo")
    communicator_of(groups["unchecked"]).strict = False
    return groups


def _watch(stall_after: float) -> None:
    # (re)armed before each trial: a rank stuck longer prints its threads' stacks and exits,
    # so the benchmark fails naming it instead of waiting for ever
    faulthandler.dump_traceback_later(stall_after, exit=True)


def run_trials(
    comm: Any, model: str, trials: int, steps: int, stall_after: float = 300.0
) -> dict[str, list[float]]:
    """In each rank: every variant's step time (seconds) per trial, the slowest rank's."""
    _watch(stall_after)
    groups = _groups()
    torch.manual_seed(0)
    base = _model(model)
    nets, opts = {}, {}
    for variant, group in groups.items():
        net = _model(model)
        net.load_state_dict(base.state_dict())
        nets[variant] = DDP(net, process_group=group)
        opts[variant] = torch.optim.SGD(nets[variant].parameters(), lr=1e-4)
    x = _batch(model)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for trial in range(trials + 1):  # the first is a warm-up
        order = VARIANTS[trial % 3 :] + VARIANTS[: trial % 3]
        _watch(stall_after)
        for variant in order:
            net, opt = nets[variant], opts[variant]
            dist.barrier(groups["gloo"])
            start = time.perf_counter()
            for _ in range(steps):
                net(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
            took = torch.tensor([(time.perf_counter() - start) / steps], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX, group=groups["gloo"])
            if trial:
                times[variant].append(float(took))
    _watch(stall_after)
    # the models first: a DDP model outliving its destroyed gloo group can hang the rank
    # (see the module's docstring)
    del nets, opts, net, opt
    for group in groups.values():
        dist.destroy_process_group(group)
    faulthandler.cancel_dump_traceback_later()
    return times


def report(model: str, times: dict[str, list[float]]) -> list[str]:
    """The table rows of one model: median, ratio to gloo, spread of the per-trial ratios."""
    rows = []
    base = statistics.median(times["gloo"])
    for variant in VARIANTS:
        ratios = [t / g for t, g in zip(times[variant], times["gloo"])]
        median = statistics.median(times[variant])
        rows.append(
            f"  {model:<5} {variant:<10} {median * 1e3:10.3f} ms  {median / base:6.3f}x  "
            f"[{min(ratios):.3f} - {max(ratios):.3f}]"
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its table (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--models", nargs="+", default=["mlp", "25m"], choices=["mlp", "25m"])
    parser.add_argument("--trials", type=int, default=15, help="trials per variant")
    parser.add_argument("--steps", type=int, default=20, help="steps timed per trial")
    parser.add_argument(
        "--stall-after",
        type=float,
        default=300.0,
        help="seconds without progress after which a rank prints its stacks and exits "
        "(default 300)",
    )
    args = parser.parse_args(argv)
    print(
        f"DDP step, {args.size} ranks on 127.0.0.1, {args.trials} trials of {args.steps} steps "
        f"per variant, interleaved (torch {torch.__version__})"
    )
    print(f"  {'model':<5} {'variant':<10} {'median':>13}  {'ratio':>7}  spread of trial ratios")
    with World(args.size, timeout=3600, pg_timeout=600) as world:
        for model in args.models:
            times = world.run(
                run_trials, model, args.trials, args.steps, args.stall_after, timeout=36000
            )[0]
            for row in report(model, times):
                print(row)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
