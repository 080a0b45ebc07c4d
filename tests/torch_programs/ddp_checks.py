"""What the ranks run in tests/torch_programs: torch programs on groups commlib serves.

Module-level functions, importable by the ranks of a gloo world or of the mpi
kit. A rank keeps one group per torch backend (made on first use, by every
rank in the same order), so a module's tests share them.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from commlib.observe import disable_flight_recorder, enable_flight_recorder

_groups: dict[str, Any] = {}


def group_of(backend: str) -> Any:
    """This rank's group of every rank on torch backend ``backend`` (made on first use)."""
    group = _groups.get(backend)
    if group is None:
        group = _groups[backend] = dist.new_group(backend=backend)
    return group


def model(width: int = 32) -> nn.Module:
    layers = [nn.Linear(8, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 4))
    return nn.Sequential(*layers)


def train_ddp(
    comm: Any, backend: str, steps: int = 3, width: int = 32, bucket_mb: float = 0.004
) -> dict[str, Any]:
    """DDP on a group of ``backend``: the trained weights, and the collectives commlib saw."""
    group = group_of(backend)
    rank = dist.get_rank()
    torch.manual_seed(rank)  # each rank starts elsewhere: DDP broadcasts rank 0's weights
    net = model(width)
    recorder = enable_flight_recorder()
    # the recorder keeps what this rank's earlier tests recorded: only this run's entries count
    earlier = {(e["group"], e["seq"]) for e in recorder.snapshot()["entries"]}
    try:
        # small buckets: several gradient all_reduces a step
        ddp = DDP(net, process_group=group, bucket_cap_mb=bucket_mb)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(steps):
            torch.manual_seed(100 * step + rank)  # each rank its own batch
            ddp(torch.randn(16, 8)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        seen = [
            (e["name"], e["shapes"])
            for e in recorder.snapshot()["entries"]
            if (e["group"], e["seq"]) not in earlier
        ]
    finally:
        disable_flight_recorder()
    weights = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    return {"weights": weights.tolist(), "seen": seen}


def differing_model(comm: Any, backend: str, init_sync: bool) -> tuple[str, str, float]:
    """Rank 1's model is float64, the others' float32: what DDP says on each rank, how soon."""
    group = group_of(backend)
    torch.manual_seed(0)
    net = model()
    if dist.get_rank() == 1:
        net = net.double()
    start = time.monotonic()
    try:
        ddp = DDP(net, process_group=group, init_sync=init_sync)
        x = torch.randn(4, 8, dtype=next(net.parameters()).dtype)
        ddp(x).sum().backward()
    except Exception as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "no error", "", time.monotonic() - start


def _engine_state() -> tuple[int, int]:
    """How many groups torch knows, and this process's OS threads (gloo's live in groups)."""
    import gc
    import os

    import torch.distributed.distributed_c10d as c10d

    gc.collect()
    return len(c10d._world.pg_map), len(os.listdir("/proc/self/task"))


def make_and_destroy_groups(comm: Any, backend: str, rounds: int, with_ddp: bool) -> dict:
    """``rounds`` times: a new group (DDP on it), a step, the group destroyed before the model.

    The order a program that destroys its groups first meets (the model goes
    when it goes out of scope): DDP's reducer then holds the group's last
    reference. What torch knows and the threads, before and after.
    """
    before = _engine_state()
    for _ in range(rounds):
        group = dist.new_group(backend=backend)
        t = torch.ones(3)
        dist.all_reduce(t, group=group)
        net = DDP(model(), process_group=group) if with_ddp else None
        if net is not None:
            net(torch.randn(4, 8)).sum().backward()
        dist.destroy_process_group(group)
        del group, t
        del net  # the reducer's reference to the group was the last
    return {"before": before, "after": _engine_state()}
