"""Direct calls: a blocking, unchecked collective whose op, dtype and root an earlier call
validated goes from the communicator to the process group's own method in one engine step
(``Engine.learn`` / ``Engine.direct``), with the same results, errors and events.

One process on torch's fake process group for which call takes the lane; gloo ranks
for the results (worlds 1-4, a subgroup).
"""

from __future__ import annotations

import contextlib
import datetime
from unittest import mock

import pytest
import torch
import torch.distributed as dist

import commlib
from commlib import _lanes
from commlib.errors import CommBrokenError

# -- one process, torch's fake process group: which calls take the lane ----------------


@contextlib.contextmanager
def _counted(engine):
    with (
        mock.patch.object(engine, "direct", wraps=engine.direct) as direct,
        mock.patch.object(engine, "direct_p2p", wraps=engine.direct_p2p) as direct_p2p,
    ):
        yield _Both(direct, direct_p2p)


class _Both:
    """The calls of Engine.direct and Engine.direct_p2p, counted together."""

    def __init__(self, *mocks):
        self.mocks = mocks

    @property
    def call_count(self):
        return sum(m.call_count for m in self.mocks)


def _calls(comm):
    """Each collective the lanes serve, as the dispatch benchmark calls it (rank 0 of 8)."""
    t = torch.ones(4)
    out = torch.empty(32)
    parts = [torch.ones(4) for _ in range(8)]
    return {
        "all_reduce": lambda: comm.all_reduce(t),
        "broadcast": lambda: comm.broadcast(t, src=0),
        "reduce": lambda: comm.reduce(t, dst=0, op="max"),
        "all_gather_into_tensor": lambda: comm.all_gather_into_tensor(out, t),
        "reduce_scatter": lambda: comm.reduce_scatter(torch.empty(4), torch.ones(32)),
        "all_to_all_single": lambda: comm.all_to_all_single(out, torch.ones(32)),
        "scatter": lambda: comm.scatter(t, parts, src=0),
        "barrier": lambda: comm.barrier(),
        "send": lambda: comm.send(t, dst=1),
        "recv": lambda: comm.recv(t, src=1),
    }


def test_the_first_call_learns_the_lane_and_the_next_take_it(fake8):
    engine = fake8._engine
    for name, call in _calls(fake8).items():
        with _counted(engine) as direct:
            call()
            assert direct.call_count == 0, name  # validated and learnt on the way
            call()
            call()
            assert direct.call_count == 2, name
        assert any(key[0] == name and lane is not None for key, lane in engine.lanes.items())


def test_what_the_lane_does_not_take_goes_the_whole_way(fake8):
    comm, engine = fake8, fake8._engine
    t = torch.ones(4)
    comm.all_reduce(t)
    with _counted(engine) as direct:
        comm.all_reduce(t, async_op=True).wait()
        comm.all_reduce(t, timeout=5)
        comm.all_reduce(torch.ones(4, 2).t())  # not contiguous
        comm.all_reduce(torch.ones(4, dtype=torch.complex64))
        comm.all_reduce(torch.ones(4, dtype=torch.int64), op="mean")  # divided in float
        comm.all_reduce(torch.ones(4).as_subclass(_Sub))
        comm.reduce(t, dst=1)  # another root: learnt now, taken next time
        assert direct.call_count == 0
        comm.reduce(t, dst=1)
        assert direct.call_count == 1


class _Sub(torch.Tensor):
    pass


def test_a_mean_takes_the_lane_and_divides_in_place(fake8):
    comm, engine = fake8, fake8._engine
    t = torch.full((4,), 8.0)
    comm.all_reduce(t, op="mean")  # the fake group sums nothing: t is this rank's alone
    assert t.tolist() == [1.0] * 4
    with _counted(engine) as direct:
        comm.all_reduce(t, op="mean")
        assert direct.call_count == 1 and t.tolist() == [0.125] * 4
        leaf = torch.full((4,), 8.0, requires_grad=True)
        comm.all_reduce(leaf, op="mean")  # the whole way: written outside autograd
        assert direct.call_count == 1 and leaf.tolist() == [1.0] * 4


def test_checked_collectives_and_the_finite_check_take_no_lane(fake8):
    comm, engine = fake8, fake8._engine
    t = torch.ones(4)
    comm.all_reduce(t)
    lane = engine.lanes[("all_reduce", "sum", torch.float32)]
    comm.check_finite = True
    with mock.patch.object(engine, "direct", wraps=engine.direct) as direct:
        comm.all_reduce(t)
        # the flag's round may go direct (all_gather_slots); the all_reduce does not
        assert lane not in [call.args[1] for call in direct.call_args_list]
    comm.check_finite = False
    comm.strict = True
    with mock.patch.object(engine, "direct", wraps=engine.direct) as direct:
        comm.all_reduce(t)
        comm.broadcast(t, 0)
        # the check's round may go direct (all_gather_slots); the collectives do not,
        # and a checked call learns no lane (none would serve it)
        used = [call.args[1] for call in direct.call_args_list]
        assert lane not in used and ("broadcast", 0, torch.float32) not in engine.lanes
    comm.strict = False
    with _counted(engine) as direct:
        comm.all_reduce(t)
        assert direct.call_count == 1


def test_an_open_coalescing_manager_takes_the_whole_way(fake8):
    from torch.distributed.distributed_c10d import _coalescing_manager

    comm, engine = fake8, fake8._engine
    t = torch.ones(4)
    comm.all_reduce(t)
    lane = engine.lanes[("all_reduce", "sum", torch.float32)]
    with _coalescing_manager(group=dist.group.WORLD):
        assert not _lanes.serves(engine, lane, t)
    assert _lanes.serves(engine, lane, t)


def test_all_gather_into_tensor_takes_its_lane_for_flat_dense_matching_tensors_only(fake8):
    comm, engine = fake8, fake8._engine
    t, out = torch.ones(4), torch.empty(32)
    comm.all_gather_into_tensor(out, t)  # learnt
    with _counted(engine) as direct:
        comm.all_gather_into_tensor(out, t)
        assert direct.call_count == 1
        comm.all_gather_into_tensor(torch.empty(8, 4), t)  # 2-dim output: a flat view
        comm.all_gather_into_tensor(torch.empty(64)[::2], t)  # strided output: a copy
        comm.all_gather_into_tensor(out, torch.ones(4, 2)[:, 0])  # strided input
        comm.all_gather_into_tensor(torch.empty(8, 4), torch.ones(1, 4))
        assert direct.call_count == 1
        sent = engine.seq
        sparse = torch.ones(4).to_sparse()  # no strides to read: the method's refusal
        with pytest.raises((TypeError, ValueError, RuntimeError)):
            comm.all_gather_into_tensor(out, sparse)
        with pytest.raises(ValueError, match="output has 33 elements"):
            comm.all_gather_into_tensor(torch.empty(33), t)
        with pytest.raises(TypeError, match=r"output dtype torch\.float64 differs"):
            comm.all_gather_into_tensor(torch.empty(32, dtype=torch.float64), t)
        assert direct.call_count == 1 and engine.seq == sent  # refused: nothing sent


def test_reduce_scatter_takes_its_lane_for_flat_dense_matching_tensors_only(fake8):
    comm, engine = fake8, fake8._engine
    out, x = torch.empty(4), torch.ones(32)
    comm.reduce_scatter(out, x)  # learnt
    with _counted(engine) as direct:
        comm.reduce_scatter(out, x)
        assert direct.call_count == 1
        comm.reduce_scatter(out, torch.ones(8, 4))  # 2-dim input: a flat view
        comm.reduce_scatter(torch.empty(8)[::2], x)  # strided output
        assert direct.call_count == 1
        sent = engine.seq
        with pytest.raises(ValueError):
            comm.reduce_scatter(out, torch.ones(33))
        with pytest.raises((TypeError, ValueError)):
            comm.reduce_scatter(out, torch.ones(32, dtype=torch.float64))
        assert direct.call_count == 1 and engine.seq == sent  # refused: nothing sent


def test_a_dropped_communicator_is_freed_without_the_collector(fake8):
    import gc
    import weakref

    gc.collect()
    gc.disable()  # freed by reference counts alone: no cycle through its lanes
    try:
        comm = commlib.Communicator(group=fake8.group, backend=fake8.plugin, strict=False)
        for call in _calls(comm).values():
            call()
            call()  # lanes learnt and taken
        del call  # (it holds the communicator)
        comm.check_finite = True
        assert comm._lanes.check_finite is True
        comm.strict = False  # a new guard and lanes keep the setting
        assert comm._lanes.check_finite is True and comm.check_finite is True
        freed, engine_freed = weakref.ref(comm), weakref.ref(comm._engine)
        del comm
        assert freed() is None and engine_freed() is None
    finally:
        gc.enable()


def test_arguments_are_still_refused_after_a_lane_was_learnt(fake8):
    comm = fake8
    comm.all_reduce(torch.ones(4, dtype=torch.int32), op="band")
    with pytest.raises(TypeError, match="needs an integer or bool tensor"):
        comm.all_reduce(torch.ones(4), op="band")
    comm.all_gather_into_tensor(torch.empty(32), torch.ones(4))
    with pytest.raises(ValueError, match="output has 31 elements"):
        comm.all_gather_into_tensor(torch.empty(31), torch.ones(4))
    comm.broadcast(torch.ones(4), src=0)
    with pytest.raises(ValueError, match="out of range"):
        comm.broadcast(torch.ones(4), src=8)
    comm.scatter(torch.ones(4), [torch.ones(4)] * 8, src=0)
    with pytest.raises(ValueError, match="needs 8 tensors"):
        comm.scatter(torch.ones(4), [torch.ones(4)] * 7, src=0)


def test_arguments_no_lane_can_hold_are_refused_as_before(fake8):
    # every lane learnt first: the wrong arguments below must reach the checks, not a
    # lookup that fails on them (an unhashable op, None for a tensor)
    for call in _calls(fake8).values():
        call()
    t = torch.ones(4)
    with pytest.raises(TypeError, match="op must be a string"):
        fake8.all_reduce(t, op=["sum"])
    with pytest.raises(TypeError, match="src must be an int"):
        fake8.broadcast(t, src=[0])
    with pytest.raises(TypeError, match="dst must be an int"):
        fake8.reduce(t, dst=0.0)
    with pytest.raises(TypeError, match=r"output must be a torch\.Tensor"):
        fake8.reduce_scatter(None, torch.ones(32))
    with pytest.raises(TypeError):
        fake8.reduce_scatter(torch.empty(4), torch.ones(32), op={"sum"})
    with pytest.raises(TypeError, match="src must be an int"):
        fake8.scatter(t, [t] * 8, src=None)


def test_a_lane_counts_its_call_and_tells_observers(fake8):
    comm = fake8
    seen = []

    class Observer:
        @commlib.hookimpl
        def commlib_collective_end(self, event):
            seen.append((event.name, event.seq, event.state))

    t = torch.ones(4)
    comm.all_reduce(t)
    before = comm._engine.seq
    observer = Observer()
    commlib.plugins.plugin_manager().register(observer)
    try:
        comm.all_reduce(t)
        comm.broadcast(t, 0)
    finally:
        commlib.plugins.plugin_manager().unregister(observer)
    assert seen == [
        ("all_reduce", before + 1, "completed"),
        ("broadcast", before + 2, "completed"),
    ]


def test_a_broken_group_refuses_on_the_lane_too(fake8):
    comm, engine = fake8, fake8._engine
    t = torch.ones(4)
    comm.all_reduce(t)
    engine.health.mark_broken("all_reduce #1: a test broke it")
    try:
        with pytest.raises(CommBrokenError, match="a test broke it"):
            comm.all_reduce(t)
    finally:
        engine.health.broken = None


def test_an_engine_failure_on_the_lane_is_mapped(fake8):
    comm, engine = fake8, fake8._engine
    t = torch.ones(4)
    comm.all_reduce(t)
    key = ("all_reduce", "sum", torch.float32)
    lane = engine.lanes[key]

    def fails(*args):
        raise RuntimeError("Connection closed by peer")

    engine.lanes[key] = lane._replace(call=fails)
    try:
        with pytest.raises(commlib.CommError, match="all_reduce failed on rank 0"):
            comm.all_reduce(t)
        assert engine.health.broken is not None
    finally:
        engine.lanes[key] = lane
        engine.health.broken = None


def test_the_engine_timeout_is_bound_before_a_lane_call(fake8):
    comm, engine = fake8, fake8._engine
    t = torch.ones(4)
    comm.all_reduce(t)
    with mock.patch.object(engine.plugin, "set_timeout") as set_timeout:
        engine.timeout = datetime.timedelta(seconds=7)
        comm.all_reduce(t)
        comm.all_reduce(t)
    assert set_timeout.call_count == 1  # once per change, not per call


# -- gloo: results through the lanes --------------------------------------------------


def _on_lanes(comm):
    c = commlib.Communicator(strict=False)
    world, me = c.world_size, c.rank
    got = {}
    big = (1 << 20) // 4  # past the small exchange, so all_reduce takes the lane on gloo
    for round_ in range(2):  # the first learns, the second takes the lane
        x = torch.full((big,), float(me + round_))
        c.all_reduce(x, op="max")
        got[("all_reduce", round_)] = x[:2].tolist()
        m = torch.full((big,), float(me + round_))
        c.all_reduce(m, op="mean")
        got[("mean", round_)] = m[:2].tolist()
        b = torch.full((3,), float(me * 10 + round_))
        c.broadcast(b, src=world - 1)
        got[("broadcast", round_)] = b.tolist()
        s = torch.empty(2)
        parts = [torch.full((2,), float(r + round_)) for r in range(world)] if me == 0 else None
        c.scatter(s, parts, src=0)
        got[("scatter", round_)] = s.tolist()
        a = torch.empty(world)
        c.all_to_all_single(a, torch.arange(float(world)) + 100 * me + round_)
        got[("all_to_all_single", round_)] = a.tolist()
        c.barrier()
        if world > 1:  # around the ring: right, then from the left
            p = torch.full((2,), float(me + round_))
            q = torch.empty(2)
            if me % 2 == 0:
                c.send(p, dst=(me + 1) % world)
                c.recv(q, src=(me - 1) % world)
            else:
                c.recv(q, src=(me - 1) % world)
                c.send(p, dst=(me + 1) % world)
            got[("p2p", round_)] = q.tolist()
    sub = c.new_group(list(range(1, world))) if world > 1 else None
    if sub is not None and sub.is_member:
        for round_ in range(2):
            y = torch.full((2,), float(me + round_))
            sub.broadcast(y, src=0)  # group rank 0 is world rank 1
            got[("sub broadcast", round_)] = y.tolist()
    lanes = sorted(k[0] for k, lane in c._engine.lanes.items() if lane is not None)
    return got, lanes


def test_gloo_results_through_the_lanes(world):
    n = world.size
    for me, (got, lanes) in enumerate(world.run(_on_lanes)):
        for round_ in range(2):
            assert got[("all_reduce", round_)] == [float(n - 1 + round_)] * 2
            assert got[("mean", round_)] == [(n - 1) / 2 + round_] * 2
            assert got[("broadcast", round_)] == [float((n - 1) * 10 + round_)] * 3
            assert got[("scatter", round_)] == [float(me + round_)] * 2
            assert got[("all_to_all_single", round_)] == [
                100.0 * r + me + round_ for r in range(n)
            ]
            if n > 1 and me > 0:
                assert got[("sub broadcast", round_)] == [1.0 + round_] * 2
            if n > 1:
                assert got[("p2p", round_)] == [float((me - 1) % n + round_)] * 2
        expected = {"all_reduce", "broadcast", "barrier"}
        if n > 1:  # a group of one copies, through the methods
            expected |= {"all_to_all_single", "scatter", "send", "recv"}
        assert expected <= set(lanes), lanes
