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
  (a world of one, in this process), and the collective works beside a
  ``Fabric(...)`` that joined a running world (as under torchrun), at 2 and 3
  ranks, giving what Fabric's own collectives give.

Functions named ``_on_*`` run inside the harness's ranks (``fn(comm, ...)``).
"""

from __future__ import annotations

import datetime
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
from lightning_fabric.plugins.collectives import Collective, TorchCollective

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
        for call in (  # output lists are checked only in a member
            lambda: right.all_gather([torch.zeros(1)] * 2, torch.ones(1)),
            lambda: right.gather(torch.ones(1), None, dst=1),
            lambda: right.all_gather_object([None] * 2, 1),
        ):
            with pytest.raises(NotInGroupError):
                call()
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


# -- the default group's life cycle, and Fabric(...) itself ------------------------------------
def test_setup_starts_and_teardown_destroys_the_default_group():
    # Fabric's check_destroy_group, in this process (a world of one): every group
    # made is destroyed, and the last teardown destroys the default group setup started
    assert not CommlibCollective.is_initialized()
    collective = CommlibCollective()
    try:
        with (
            mock.patch.dict(os.environ, clear=True),
            mock.patch.object(
                CommlibCollective, "new_group", wraps=CommlibCollective.new_group
            ) as made,
            mock.patch.object(
                CommlibCollective, "destroy_group", wraps=CommlibCollective.destroy_group
            ) as destroyed,
        ):
            collective.setup(
                main_address="127.0.0.1",
                main_port=29500,
                backend="gloo",
                store=dist.HashStore(),
                world_size=1,
                rank=0,
            )
            assert not os.environ  # the address and port were there only while it started
            assert CommlibCollective.manages_default_group and dist.is_initialized()
            assert collective.setup() is collective  # already up: nothing more
            collective.create_group()
            this = torch.tensor([3.0])
            assert collective.all_reduce(this, op=ReduceOp.MIN) is this and this.item() == 3.0
            collective.teardown()
        assert made.call_count == destroyed.call_count - 1 == 1
        assert not dist.distributed_c10d._pg_map and not CommlibCollective.is_initialized()
        assert not CommlibCollective.manages_default_group
    finally:
        if dist.is_initialized():  # never leave this process distributed
            dist.destroy_process_group()
        CommlibCollective.manages_default_group = False


def _inside_fabric(comm):
    # as under torchrun: the processes exist and torch.distributed runs; Fabric joins
    fabric = Fabric(accelerator="cpu", devices=comm.world_size, strategy="ddp")
    fabric.launch()
    c = CommlibCollective()
    rank = fabric.global_rank
    mine = torch.tensor([float(rank + 1)])
    theirs = fabric.all_reduce(mine.clone(), reduce_op="sum")
    assert torch.equal(c.all_reduce(mine.clone(), "sum"), theirs)
    assert c.broadcast_object_list([rank], src=1) == [fabric.broadcast(rank, src=1)]
    ours = c.all_gather([torch.zeros(1) for _ in range(fabric.world_size)], mine)
    assert torch.equal(torch.stack(ours), fabric.all_gather(mine))
    everyone = CommlibCollective().create_group()  # ranks=None: a new group of all ranks
    gathered = everyone.all_gather_object([None] * fabric.world_size, rank)
    everyone.teardown()
    assert dist.is_initialized() and not CommlibCollective.manages_default_group
    fabric.barrier()
    return gathered


def test_inside_fabric(world2, world3):
    for world in (world2, world3):
        assert world.run(_inside_fabric) == [list(range(world.size))] * world.size


def _on_output_lists(comm):
    c = CommlibCollective()
    r, n = c.rank, c.world_size
    out = {}

    def attempt(name, fn):
        try:
            out[name] = fn()
        except (ValueError, TypeError) as exc:
            out[name] = (type(exc).__name__, str(exc))

    # output slots bigger than what each rank sends: refused before sending, on every rank
    attempt("shape", lambda: c.all_gather([torch.zeros(4) for _ in range(n)], torch.ones(1)))
    # int64 outputs for a float tensor: torch refuses them too (no silent cast)
    attempt("dtype", lambda: c.all_gather([torch.zeros(1, dtype=torch.long)] * n, torch.ones(1)))
    # only the last rank's own entry is wrong: every rank learns of it
    last = r == n - 1
    sizes = [2 if last and i == r else 1 for i in range(n)]
    attempt("one_rank", lambda: c.all_gather([torch.zeros(s) for s in sizes], torch.ones(1)))
    # ranks sending different shapes, each into outputs shaped like its own tensor
    # (torch's rule): found once the shapes arrive; the collective itself completed
    mine = torch.ones(1 + r)
    attempt("uneven", lambda: c.all_gather([torch.zeros(1 + r) for _ in range(n)], mine))
    # gather's list on dst, of the wrong shape
    outs = [torch.zeros(3) for _ in range(n)] if r == 0 else None
    attempt("gather", lambda: c.gather(torch.ones(1), outs, dst=0))
    # outputs stay out of autograd, as torch's do
    w = torch.ones(2, requires_grad=True)
    got = c.all_gather([torch.zeros(2) for _ in range(n)], w * (r + 1))
    out["grad"] = [(o.requires_grad, o.grad_fn is None, o.tolist()) for o in got]
    # ranks sending different shapes into outputs shaped to match: commlib takes it
    fits = c.all_gather([torch.zeros(1 + i) for i in range(n)], torch.full((1 + r,), float(r)))
    out["fits"] = [o.tolist() for o in fits]
    return out


def test_all_gather_and_gather_check_the_output_lists(world2, world3):
    for world in (world2, world3):
        n = world.size
        for got in world.run(_on_output_lists):
            kind, msg = got["shape"]
            assert kind == "RemoteArgumentError" and "tensor_list[0] has shape (4,)" in msg
            assert got["dtype"][0] == "ValueError"  # every rank's own: each raises it
            assert "is torch.int64; the tensor sent is torch.float32" in got["dtype"][1]
            kind, msg = got["one_rank"]
            assert kind == "RemoteArgumentError" and f"rank {n - 1} refused" in msg
            assert f"tensor_list[{n - 1}] has shape (2,)" in msg
            kind, msg = got["uneven"]
            assert kind == "ValueError" and "the tensor it receives has shape" in msg
            kind, msg = got["gather"]
            assert kind == "RemoteArgumentError" and "gather_list[0] has shape (3,)" in msg
            assert got["grad"] == [(False, True, [q + 1.0] * 2) for q in range(n)]
            assert got["fits"] == [[float(q)] * (1 + q) for q in range(n)]
