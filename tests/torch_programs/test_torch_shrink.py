"""``commlib.torch_backend.shrink``: after a rank dies, a torch group of the survivors that
DDP and torch's functions run on, served by the shrunk communicator. A world of 3 of its own.
"""

from __future__ import annotations

import datetime
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from commlib import CommTimeoutError, RankLostError
from commlib.testing import RankDied, World
from commlib.torch_backend import communicator_of, is_served, shrink
from tests.torch_programs.ddp_checks import model


def test_only_a_group_commlib_serves_is_shrunk_here():
    with pytest.raises(ValueError, match="not a process group of a commlib torch backend"):
        shrink(None)


def _step(ddp: DDP, opt: torch.optim.Optimizer, seed: int) -> None:
    torch.manual_seed(seed)
    ddp(torch.randn(8, 8)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def _train_lose_rank_2_and_go_on(comm) -> dict:
    group = dist.new_group(backend="commlib-gloo", timeout=datetime.timedelta(seconds=20))
    torch.manual_seed(0)
    net = model()
    ddp = DDP(net, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    _step(ddp, opt, dist.get_rank())
    dist.barrier(group)
    if dist.get_rank() == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    try:
        _step(ddp, opt, dist.get_rank())
        lost = "no error"
    except (RankLostError, CommTimeoutError) as exc:
        lost = type(exc).__name__
    survivors = shrink(group)
    t = torch.ones(2)
    dist.all_reduce(t, group=survivors)
    ddp = DDP(net, process_group=survivors)  # the same model, on the survivors
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(2):
        _step(ddp, opt, 10 * step + dist.get_rank())
    try:
        dist.all_reduce(torch.ones(1), group=group)
        old = "no error"
    except Exception as exc:
        old = type(exc).__name__
    out = {
        "lost": lost,
        "size": survivors.size(),
        "rank": dist.get_rank(survivors),
        "served": is_served(survivors) and communicator_of(survivors).world_size,
        "sum": t.tolist(),
        "weights": torch.cat([p.detach().reshape(-1) for p in net.parameters()]).tolist(),
        "old": old,
    }
    dist.destroy_process_group(survivors)
    return out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ddp_goes_on_on_the_shrunk_torch_group_after_a_rank_died():
    with World(3, timeout=180, pg_timeout=60) as world:
        outcomes = world.outcomes(_train_lose_rank_2_and_go_on, timeout=180)
        world.kill()
    assert isinstance(outcomes[2].error, RankDied), outcomes[2]
    results = [o.value for o in outcomes[:2]]
    assert all(o.ok for o in outcomes[:2]), outcomes[:2]
    for rank, r in enumerate(results):
        assert r["lost"] in ("RankLostError", "CommTimeoutError"), r["lost"]
        assert (r["size"], r["rank"], r["served"]) == (2, rank, 2), r
        assert r["sum"] == [2.0, 2.0]
        assert r["old"] != "no error"  # the old group stays broken: it raises at once
    assert results[0]["weights"] == results[1]["weights"]  # DDP kept the survivors in step
