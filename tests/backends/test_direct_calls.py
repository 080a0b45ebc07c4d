"""gloo's collectives call the ProcessGroup directly, and go through torch.distributed
where it must decide (tensor subclasses, subgroups' ranks stay group ranks)."""

from __future__ import annotations

from unittest import mock

import torch


class _Traced(torch.Tensor):
    """A tensor subclass: its collectives must reach torch.distributed's functions."""


def _on_direct_and_fallback(comm):
    import torch.distributed as tdist

    plugin = comm.plugin
    world, me = comm.world_size, comm.rank
    seen = {}
    with (
        mock.patch.object(tdist, "broadcast", wraps=tdist.broadcast) as broadcast,
        mock.patch.object(tdist, "all_reduce", wraps=tdist.all_reduce) as all_reduce,
    ):
        x = torch.full((3,), float(me))
        plugin.broadcast(x, world - 1, None)
        seen["broadcast"] = (x.tolist(), broadcast.call_count)
        y = torch.full((2,), float(me + 1), dtype=torch.complex64)
        plugin.all_reduce(y, "sum", None, async_op=True).wait()
        seen["complex all_reduce"] = (y.tolist(), all_reduce.call_count)
        z = torch.full((2,), float(me)).as_subclass(_Traced)
        plugin.broadcast(z, 0, None)
        seen["subclass"] = (torch.Tensor(z).tolist(), broadcast.call_count)
    parts = [torch.empty(2) for _ in range(world)] if me == 0 else None
    plugin.gather(torch.full((2,), float(me)), parts, 0, None)
    seen["gather"] = None if parts is None else [p.tolist() for p in parts]
    out = torch.empty(2)
    plugin.scatter(
        out, [torch.full((2,), 10.0 * r) for r in range(world)] if me == 1 else None, 1, None
    )
    seen["scatter"] = out.tolist()
    r = torch.full((2,), float(me + 1))
    plugin.reduce(r, 0, "max", None)
    seen["reduce"] = r.tolist() if me == 0 else None
    seen["rank, size"] = (plugin.rank(None), plugin.world_size(None))
    return seen


def test_direct_calls_and_fallback(multi_world):
    n = multi_world.size
    total = sum(range(1, n + 1))
    for me, seen in enumerate(multi_world.run(_on_direct_and_fallback)):
        # direct: torch.distributed's function was not called
        assert seen["broadcast"] == ([float(n - 1)] * 3, 0)
        assert seen["complex all_reduce"] == ([complex(total, 0)] * 2, 0)
        # a subclass goes through torch.distributed, with the same result
        assert seen["subclass"] == ([0.0, 0.0], 1)
        assert seen["gather"] == ([[float(r)] * 2 for r in range(n)] if me == 0 else None)
        assert seen["scatter"] == [10.0 * me] * 2
        assert seen["reduce"] == ([float(n)] * 2 if me == 0 else None)
        assert seen["rank, size"] == (me, n)


def _on_subgroup_roots(comm):
    import commlib

    # ranks 1..n-1: group rank 0 is world rank 1
    sub = comm.new_group(list(range(1, comm.world_size)))
    if sub is None or not sub.is_member:
        return None
    x = torch.full((2,), float(comm.rank))
    sub.broadcast(x, src=0)
    gathered = sub.gather(torch.full((1,), float(comm.rank)), dst=sub.world_size - 1)
    assert isinstance(sub, commlib.Communicator)
    return x.tolist(), [t.tolist() for t in gathered]


def test_subgroup_ranks_are_group_ranks(world3):
    got = world3.run(_on_subgroup_roots)
    assert got[0] is None
    assert got[1] == ([1.0, 1.0], [])
    assert got[2] == ([1.0, 1.0], [[1.0], [2.0]])
