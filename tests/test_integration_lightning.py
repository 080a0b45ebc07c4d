"""Lightning Fabric's ``Collective`` on commlib (issue 13), against the real lightning-fabric.

The expectations are those of Fabric's own ``TorchCollective`` tests:

* every method, with ``src``/``dst`` as world ranks, returns what
  ``TorchCollective`` returns on the same gloo world (2 and 3 ranks), on the
  world and on a group that is not a prefix of it; the two collectives gloo
  lacks (``reduce_scatter``, ``all_to_all``) against hand-computed values;
* two overlapping groups at world 3 (Fabric's ``_test_two_groups``), a
  non-member passing ``barrier``; groups torn down leave torch's group map;
* ops by name or ``ReduceOp``, create/teardown errors as Fabric words them;
* ``setup()`` starts the default group and the last ``teardown()`` destroys it
  (Fabric's launcher, as its tests launch), and the collective works inside
  ``Fabric(...).launch``.

Functions named ``_on_*`` run inside the harness's ranks (``fn(comm, ...)``).
"""

from __future__ import annotations

import datetime
import functools
import os
from unittest import mock

import pytest
import torch

pytest.importorskip(
    "lightning_fabric",
    reason="lightning-fabric is not installed (pip install -e '.[integrations]')",
)

import torch.distributed as dist
from lightning_fabric import Fabric
from lightning_fabric.accelerators import CPUAccelerator
from lightning_fabric.plugins.collectives import Collective, TorchCollective
from lightning_fabric.plugins.environments import LightningEnvironment
from lightning_fabric.strategies import DDPStrategy
from lightning_fabric.strategies.launchers.multiprocessing import _MultiProcessingLauncher

from commlib import Communicator, NotInGroupError
from commlib.integrations.lightning import CommlibCollective

ReduceOp = dist.ReduceOp


# -- in this process: a world of one, no torch.distributed -----------------------------------
def test_it_is_a_fabric_collective():
    assert isinstance(CommlibCollective(), Collective)
    assert issubclass(CommlibCollective, Collective)


def test_convert_ops():
    convert = CommlibCollective._convert_to_native_op
    for name in ("band", "bor", "bxor", "max", "min", "product", "sum"):
        assert convert(name) == name
        assert convert(getattr(ReduceOp, name.upper())) == name
    assert convert("BoR") == "bor"
    assert convert("avg") == convert(ReduceOp.AVG) == convert(ReduceOp.RedOpType.AVG) == "mean"
    assert convert("mean") == "mean"
    with pytest.raises(ValueError, match="Unsupported op 1 of type int"):
        convert(1)
    with pytest.raises(ValueError, match="'invalid' is not supported by commlib"):
        convert("invalid")
    with pytest.raises(ValueError, match="not supported by commlib"):
        convert(dist._make_nccl_premul_sum(2.0))


def test_repeated_create_and_destroy():
    collective = CommlibCollective()
    collective.create_group()
    assert isinstance(collective.group, Communicator) and collective.world_size == 1
    with pytest.raises(RuntimeError, match="CommlibCollective` already owns a group"):
        collective.create_group()
    assert collective.teardown() is collective
    assert collective._group is None
    with pytest.raises(RuntimeError, match="CommlibCollective` does not own a group"):
        collective.teardown()
    collective.create_group().teardown()  # again, and chained


def test_a_world_of_one_runs_every_collective():
    c = CommlibCollective()
    x = torch.tensor([2.0])
    assert c.broadcast(x, src=0) is x and c.all_reduce(x, "avg") is x and x.item() == 2.0
    assert c.reduce(x, dst=0, op=ReduceOp.MAX).item() == 2.0
    assert c.all_gather([torch.zeros(1)], x)[0].item() == 2.0
    assert c.gather(x, [torch.zeros(1)], dst=0)[0].item() == 2.0
    assert c.scatter(torch.zeros(1), [torch.ones(1)], src=0).item() == 1.0
    assert c.reduce_scatter(torch.zeros(1), [torch.ones(1)]).item() == 1.0
    assert c.all_to_all([torch.zeros(1)], [torch.ones(1)])[0].item() == 1.0
    assert c.all_gather_object([None], {"a": 1}) == [{"a": 1}]
    assert c.broadcast_object_list(["x"], src=0) == ["x"]
    assert c.gather_object(3, [None], dst=0) == [3]
    assert c.scatter_object_list([None], ["s"], src=0) == ["s"]
    c.barrier(device_ids=[0])
    c.monitored_barrier(datetime.timedelta(seconds=30))


def test_bad_arguments_raise_before_anything_is_sent():
    c = CommlibCollective()
    with pytest.raises(ValueError, match="src=1 is not a member"):
        c.broadcast(torch.zeros(1), src=1)
    with pytest.raises(ValueError, match="named rank only"):
        c.recv(torch.zeros(1))
    with pytest.raises(ValueError, match="tensor_list has 2 entries"):
        c.all_gather([torch.zeros(1)] * 2, torch.zeros(1))
    with pytest.raises(TypeError, match="commlib takes"):
        CommlibCollective.new_group(ranks=[0], pg_options=None)
    with pytest.raises(TypeError, match="owns a commlib Communicator"):
        CommlibCollective(group="world")


# -- on gloo worlds: every method against Fabric's TorchCollective ---------------------------
def _scenario(c, members: list[int], everything: bool) -> dict:
    """Every method of ``c`` on world ``members``; ``everything`` adds what gloo lacks."""
    me, n = dist.get_rank(), len(members)
    last = members[-1]  # a world rank; in a non-prefix group, not its group rank
    out: dict = {"rank": (c.rank, c.world_size)}
    out["broadcast"] = c.broadcast(torch.tensor([float(me)]), src=last).tolist()
    out["all_reduce"] = c.all_reduce(torch.tensor([1.0 + me]), op="sum").tolist()
    out["all_reduce_min"] = c.all_reduce(torch.tensor(me + 1), op=ReduceOp.MIN).tolist()
    reduced = c.reduce(torch.tensor([1.0 + me]), dst=last, op="max").tolist()
    if me == last:  # elsewhere torch may have used the buffer as scratch space
        out["reduce"] = reduced
    outs = [torch.zeros(2, dtype=torch.long) for _ in range(n)]
    out["all_gather"] = [t.tolist() for t in c.all_gather(outs, torch.arange(2) + 2 * me)]
    gathered = c.gather(
        torch.tensor([float(me)]), [torch.zeros(1) for _ in range(n)] if me == last else None, last
    )
    out["gather"] = None if gathered is None else [t.tolist() for t in gathered]
    parts = [torch.tensor([10.0 + i]) for i in range(n)] if me == last else None
    out["scatter"] = c.scatter(torch.zeros(1), parts, src=last).tolist()
    if n > 1 and me in members[:2]:  # the first two members exchange, tags kept apart
        first, second = members[:2]
        if me == first:
            c.send(torch.tensor([42.0]), dst=second, tag=1)
            out["recv"] = c.recv(torch.zeros(1), src=second, tag=2).tolist()
        else:
            out["recv"] = c.recv(torch.zeros(1), src=first, tag=1).tolist()
            c.send(torch.tensor([43.0]), dst=first, tag=2)
    out["all_gather_object"] = c.all_gather_object([None] * n, {"me": me})
    out["broadcast_object_list"] = c.broadcast_object_list([me, "x"], src=last)
    out["gather_object"] = c.gather_object(me, [None] * n if me == last else None, dst=last)
    inputs = [f"s{i}" for i in range(n)] if me == last else None
    out["scatter_object_list"] = c.scatter_object_list([None], inputs, src=last)
    c.barrier()
    c.monitored_barrier(datetime.timedelta(seconds=120))
    if everything:
        chunks = [torch.ones(1) * (i + 1) for i in range(n)]
        out["reduce_scatter"] = c.reduce_scatter(torch.zeros(1), chunks, op="sum").tolist()
        sent = [torch.tensor([100.0 * me + i]) for i in range(n)]
        got = c.all_to_all([torch.zeros(1) for _ in range(n)], sent)
        out["all_to_all"] = [t.tolist() for t in got]
    return out


def _on_every_method(comm, kind: str, members: list[int] | None):
    c = CommlibCollective() if kind == "commlib" else TorchCollective()
    if members is not None:  # every world rank creates the group, members or not
        c.create_group(ranks=members)
    ranks = members or list(range(dist.get_world_size()))
    if dist.get_rank() in ranks:
        out = _scenario(c, ranks, everything=kind == "commlib")
    else:
        out = {"rank": (c.rank, c.world_size)}
    if members is not None:
        c.teardown()
    return out


def _expected_extras(members: list[int], me: int) -> dict:
    n, g = len(members), members.index(me)
    return {
        "reduce_scatter": [float(n * (g + 1))],
        "all_to_all": [[100.0 * w + g] for w in members],
    }


@pytest.mark.parametrize("members", [None, [1, 2]], ids=["world", "ranks1-2"])
def test_every_method_matches_torch_collective(world2, world3, members):
    worlds = (world2, world3) if members is None else (world3,)
    for world in worlds:
        ours = world.run(_on_every_method, "commlib", members)
        theirs = world.run(_on_every_method, "torch", members)
        for me, (got, want) in enumerate(zip(ours, theirs)):
            if me not in (members or range(world.size)):
                assert got == want == {"rank": (-1, -1)}
                continue
            extras = {k: got.pop(k) for k in ("reduce_scatter", "all_to_all")}
            assert got == want, f"rank {me}"
            assert extras == _expected_extras(members or list(range(world.size)), me)


def _on_two_groups(comm):
    # Fabric's _test_two_groups, plus what is left of the groups afterwards
    rank = dist.get_rank()
    before = len(dist.distributed_c10d._pg_map)
    left = CommlibCollective().create_group(ranks=[0, 1])
    right = CommlibCollective().create_group(ranks=[1, 2])
    tensor = torch.tensor(rank)
    if rank in (0, 1):
        tensor = left.all_reduce(tensor)
        assert tensor == 1
    right.barrier()  # a non-member (rank 0) passes at once: no deadlock for rank 1
    if rank in (1, 2):
        tensor = right.all_reduce(tensor)
        assert tensor == 3
    outside = None
    if rank == 0:
        assert right.rank == right.world_size == -1
        try:
            right.all_reduce(torch.ones(1))
        except NotInGroupError as exc:
            outside = str(exc)
    groups = [left.group.group, right.group.group]
    left.teardown()
    right.teardown()
    left_over = [g for g in groups if g in dist.distributed_c10d._pg_map]
    return int(tensor), outside, left_over, len(dist.distributed_c10d._pg_map) - before


def test_two_overlapping_groups(world3):
    results = world3.run(_on_two_groups)
    assert [r[0] for r in results] == [1, 3, 3]
    assert "not a member" in results[0][1]
    for _, _, left_over, added in results:
        assert left_over == [] and added == 0  # torn down; the default group stays


# -- the default group's life cycle, launched as Fabric's own tests launch -------------------
def _launch(fn, world_size: int, num_groups: int = 1):
    strategy = DDPStrategy(
        accelerator=CPUAccelerator(),
        parallel_devices=[torch.device("cpu")] * world_size,
        cluster_environment=LightningEnvironment(),
        start_method="spawn",
    )
    collectives = [CommlibCollective() for _ in range(num_groups)]
    wrapped = functools.partial(_set_up_and_tear_down, fn, strategy, collectives)
    with mock.patch.dict(os.environ, os.environ.copy(), clear=True):
        return _MultiProcessingLauncher(strategy=strategy).launch(wrapped, strategy, *collectives)


def _set_up_and_tear_down(fn, strategy, collectives, *args):
    strategy._set_world_ranks()
    collectives[0].setup(  # one setup starts the default group for all
        world_size=strategy.num_processes,
        main_address="127.0.0.1",
        backend=strategy._get_process_group_backend(),
        rank=strategy.global_rank,
    )
    assert CommlibCollective.manages_default_group and dist.is_initialized()
    with (
        mock.patch.object(
            CommlibCollective, "new_group", wraps=CommlibCollective.new_group
        ) as made,
        mock.patch.object(
            CommlibCollective, "destroy_group", wraps=CommlibCollective.destroy_group
        ) as destroyed,
    ):
        result = fn(*args)
        for c in collectives:
            c.teardown()
    # as Fabric's check_destroy_group: every group made is destroyed, and so is the default
    assert made.call_count == destroyed.call_count - 1, (made.call_count, destroyed.call_count)
    assert not dist.distributed_c10d._pg_map and not CommlibCollective.is_initialized()
    assert not CommlibCollective.manages_default_group
    return result


def _fabric_collectives_fn(strategy, collective):
    # Fabric's _test_distributed_collectives_fn, on commlib
    collective.create_group()
    n, rank = strategy.num_processes, strategy.global_rank
    tensor_list = [torch.zeros(2, dtype=torch.long) for _ in range(n)]
    out = collective.all_gather(tensor_list, torch.arange(2, dtype=torch.long) + 2 * rank)
    torch.testing.assert_close(tuple(out), torch.arange(2 * n).split(2))
    this = torch.tensor(rank + 1)
    out = collective.reduce(this, dst=0, op="max")
    torch.testing.assert_close(out, torch.tensor(n) if rank == 0 else this)
    out = collective.all_reduce(torch.tensor(rank + 1), op=ReduceOp.MIN)
    torch.testing.assert_close(out, torch.tensor(1))


def test_setup_starts_and_teardown_destroys_the_default_group():
    _launch(_fabric_collectives_fn, world_size=2)


def _inside_fabric(fabric):
    # Fabric started the world; the collective uses it and leaves it to Fabric
    c = CommlibCollective()
    rank = fabric.global_rank
    mine = torch.tensor([float(rank + 1)])
    theirs = fabric.all_reduce(mine.clone(), reduce_op="sum")
    assert torch.equal(c.all_reduce(mine.clone(), "sum"), theirs)
    assert c.broadcast_object_list([rank], src=1) == [fabric.broadcast(rank, src=1)]
    fabric_gathered = fabric.all_gather(mine)
    ours = c.all_gather([torch.zeros(1), torch.zeros(1)], mine)
    assert torch.equal(torch.stack(ours), fabric_gathered)
    pair = CommlibCollective().create_group()  # ranks=None: every rank, a new group
    assert pair.all_gather_object([None, None], rank) == [0, 1]
    pair.teardown()
    assert dist.is_initialized() and not CommlibCollective.manages_default_group
    fabric.barrier()
    return rank


def test_inside_fabric_launch():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn")
    with mock.patch.dict(os.environ, os.environ.copy(), clear=True):
        assert fabric.launch(_inside_fabric) == 0
