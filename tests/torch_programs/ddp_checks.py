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
