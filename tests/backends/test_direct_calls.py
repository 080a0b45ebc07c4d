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
    seen.update(_direct_lists(plugin, world, me))
    return seen


def _direct_lists(plugin, world, me):
    """DirectCalls' own all_gather, reduce_scatter and all_to_all (gloo's plugin composes
    small ones from all_to_all_single): the group's methods, not torch.distributed's."""
    import torch.distributed as tdist

    from commlib_backends.direct_calls import DirectCalls

    names = ("all_gather", "all_to_all", "reduce_scatter_single", "reduce_scatter_tensor")
    names = tuple(n for n in names if hasattr(tdist, n))  # torch 2.12 has no *_single
    wrapped = {n: mock.patch.object(tdist, n, wraps=getattr(tdist, n)) for n in names}
    seen = {}
    mocks = [w.start() for w in wrapped.values()]
    try:
        outs = [torch.empty(2) for _ in range(world)]
        DirectCalls.all_gather(plugin, outs, torch.full((2,), float(me)), None)
        seen["all_gather"] = [o.tolist() for o in outs]
        chunk = torch.empty(2)
        whole = torch.arange(2.0 * world) + me
        DirectCalls.reduce_scatter(plugin, chunk, whole, "sum", None, async_op=True).wait()
        seen["reduce_scatter"] = chunk.tolist()
        got = [torch.empty(2) for _ in range(world)]
        sent = [torch.full((2,), 10.0 * me + r) for r in range(world)]
        DirectCalls.all_to_all(plugin, got, sent, None)
        seen["all_to_all"] = [g.tolist() for g in got]
        seen["torch calls"] = sum(m.call_count for m in mocks)
    finally:
        for w in wrapped.values():
            w.stop()
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
        assert seen["all_gather"] == [[float(r)] * 2 for r in range(n)]
        ranks_sum = sum(range(n))
        assert seen["reduce_scatter"] == [n * (2.0 * me + k) + ranks_sum for k in range(2)]
        assert seen["all_to_all"] == [[10.0 * r + me] * 2 for r in range(n)]
        assert seen["torch calls"] == 0


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


def _on_a_world_of_one(comm):
    import torch.distributed as tdist

    pg = tdist.group.WORLD
    names = ("allreduce", "broadcast", "reduce", "gather", "scatter", "alltoall_base")
    with mock.patch.multiple(  # any engine call fails the test
        type(pg), **{n: mock.DEFAULT for n in names if hasattr(type(pg), n)}
    ) as engine:
        x = torch.tensor([1.0, 2.0])
        comm.all_reduce(x, op="sum")
        comm.all_reduce(x, op="max")
        comm.broadcast(x, src=0)
        comm.reduce(x, dst=0, op="product")
        gathered = comm.all_gather(torch.tensor([3.0]))
        out = torch.empty(1)
        comm.all_gather_into_tensor(out, torch.tensor([4.0]))
        called = [n for n, m in engine.items() if m.called]
    return x.tolist(), [t.tolist() for t in gathered], out.tolist(), called


def test_a_world_of_one_calls_no_engine(world):
    if world.size != 1:
        return
    assert world.run(_on_a_world_of_one) == [([1.0, 2.0], [[3.0]], [4.0], [])]


def test_option_objects_are_built_once_per_op_and_root():
    import torch.distributed.distributed_c10d as c10d

    from commlib_backends.gloo import GlooBackend

    plugin = GlooBackend()
    opts = plugin._reduce_options(c10d.AllreduceOptions, "max", -1, True)
    assert opts is plugin._reduce_options(c10d.AllreduceOptions, "max", -1, True)
    assert opts.reduceOp == c10d.ReduceOp.MAX
    other = plugin._reduce_options(c10d.AllreduceOptions, "sum", -1, True)
    assert other is not opts and other.reduceOp == c10d.ReduceOp.SUM
    root = plugin._rooted_options(c10d.BroadcastOptions, 1, False)
    assert (root.rootRank, root.rootTensor) == (1, 0)
    assert root is plugin._rooted_options(c10d.BroadcastOptions, 1, False)
    assert root is not plugin._rooted_options(c10d.BroadcastOptions, 0, False)


def _on_direct_point_to_point(comm):
    import torch.distributed as tdist

    me = comm.rank
    with (
        mock.patch.object(tdist, "isend", wraps=tdist.isend) as isend,
        mock.patch.object(tdist, "irecv", wraps=tdist.irecv) as irecv,
    ):
        x = torch.full((2,), float(me), dtype=torch.complex64)
        if me == 0:
            comm.send(x, dst=1)
        elif me == 1:
            comm.recv(x, src=0)
        return x.tolist(), isend.call_count + irecv.call_count


def test_point_to_point_calls_the_group_directly(world2):
    sent, received = world2.run(_on_direct_point_to_point)
    assert sent == ([0j, 0j], 0) and received == ([0j, 0j], 0)
