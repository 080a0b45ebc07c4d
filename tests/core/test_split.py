"""comm.split (MPI_Comm_split's rule) and new_group that only the members call, on gloo.

Worlds of 2, 3 and 4 ranks of their own, each started once for the module: torch names a
group its members alone make after how many groups each member knows, and
the session's shared worlds have made classic subgroups that left some
ranks out (a documented limit of members-only groups).
"""

from __future__ import annotations

import pytest
import torch

import commlib
from commlib.errors import RemoteArgumentError
from commlib.testing import World


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"own_world{n}")
def own_world(request):
    with World(request.param, timeout=60) as world:
        yield world


def _summary(sub):
    if sub is None:
        return None
    t = torch.tensor([float(torch.distributed.get_rank())])
    sub.all_reduce(t)
    return (sub.rank, sub.world_size, sub.ranks, t.item(), sub.all_gather(sub.rank))


def _on_split(comm):
    r, n = comm.rank, comm.world_size
    out = {
        "parity": _summary(comm.split(r % 2)),
        "reversed": _summary(comm.split(0, key=-r)),
        "three": _summary(comm.split(r % 3, key=(r * 7) % 5)),
        "undefined": _summary(comm.split(None if r == 0 else 1)),
    }
    halves = comm.split(r % 2)
    out["nested"] = _summary(halves.split(0, key=-halves.rank))
    try:
        comm.split(-1 if r == n - 1 else 0)
    except RemoteArgumentError as exc:
        out["refused"] = (exc.refused, sorted(exc.failures))
    except ValueError as exc:
        out["refused"] = str(exc)
    return out


def _expected(table, color_of, key_of, r):
    color = color_of(r)
    if color is None:
        return None
    members = sorted((q for q in table if color_of(q) == color), key=lambda q: (key_of(q), q))
    return (
        members.index(r),
        len(members),
        members,
        float(sum(members)),
        list(range(len(members))),
    )


def test_split_colors_and_keys(own_world):
    world = own_world
    n = world.size
    ranks = list(range(n))
    for r, got in enumerate(world.run(_on_split)):
        assert got["parity"] == _expected(ranks, lambda q: q % 2, lambda q: q, r)
        assert got["reversed"] == _expected(ranks, lambda q: 0, lambda q: -q, r)
        assert got["three"] == _expected(ranks, lambda q: q % 3, lambda q: (q * 7) % 5, r)
        assert got["undefined"] == _expected(ranks, lambda q: None if q == 0 else 1, int, r)
        halves = [q for q in ranks if q % 2 == r % 2]
        assert got["nested"][2] == halves[::-1]  # the half's ranks, reversed
        assert got["refused"] == (True, [n - 1])


def _on_members_only(comm):
    r, n = comm.rank, comm.world_size
    pair = [0, n - 1]
    out = {}
    if r in pair:
        # only the pair calls; the others are busy with a group of their own meanwhile
        sub = commlib.new_group(pair, use_local_synchronization=True)
        t = torch.tensor([float(r)])
        sub.all_reduce(t)
        out["pair"] = (sub.world_size, t.item(), sub.ranks)
    else:
        rest = [q for q in range(n) if q not in pair]
        sub = comm.new_group(rest, use_local_synchronization=True)
        out["rest"] = sub.all_gather(torch.tensor([r]))[-1].item()
        try:
            comm.new_group(pair, use_local_synchronization=True)
        except ValueError as exc:
            out["outsider"] = str(exc)
    world = torch.ones(1)
    comm.all_reduce(world)  # everyone is still in step
    out["world"] = world.item()
    return out


def test_members_only_new_group(own_world):
    n = own_world.size
    for r, got in enumerate(own_world.run(_on_members_only)):
        assert got["world"] == n
        if r in (0, n - 1):
            assert got["pair"] == (2, float(n - 1), [0, n - 1])
        else:
            assert got["rest"] == n - 2
            assert "called by the members only" in got["outsider"]


def test_split_single_process():
    comm = commlib.Communicator()
    assert comm.split(0).world_size == 1
    assert comm.split(None) is None
    with pytest.raises(TypeError, match="key must be an int"):
        comm.split(0, key="a")
