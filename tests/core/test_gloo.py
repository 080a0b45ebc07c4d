"""Every collective and helper on real gloo ranks (world sizes 1 to 4).

Functions named ``_on_*`` run inside the ranks (``fn(comm, ...)``); the tests
compare what every rank returned.
"""

from __future__ import annotations

import os
import tempfile
from unittest import mock

import numpy as np
import pytest
import torch

import commlib as dist
from commlib.errors import NotInGroupError, RemoteArgumentError, RemoteError
from commlib.testing import RankFailed


def _on_identity(comm):
    return (
        dist.get_rank(),
        dist.get_world_size(),
        dist.get_dist_info(),
        dist.get_backend(),
        dist.is_distributed(),
        dist.is_main_process(),
        dist.get_local_rank(),
        dist.get_local_size(),
        str(dist.get_comm_device()),
        comm.backend,
        dist.get_default_group() is not None,
    )


def test_identity(world):
    n = world.size
    for r, got in enumerate(world.run(_on_identity)):
        assert got == (r, n, (r, n), "gloo", True, r == 0, r, n, "cpu", "gloo", True)


def _on_all_reduce(comm):
    r = comm.rank
    out = {}
    for op in ("sum", "product", "min", "max", "mean"):
        x = torch.tensor([1.0 + r, -2.0 * r])
        dist.all_reduce(x, op)
        out[op] = x.tolist()
    for op in ("band", "bor", "bxor", "sum", "mean"):
        x = torch.tensor([r + 1, 6, 2 * r + 3])
        dist.all_reduce(x, op)
        out["int " + op] = (x.dtype, x.tolist())
    x = torch.tensor([r % 2 == 0, True])
    dist.all_reduce(x, "band")
    out["bool band"] = x.tolist()
    x = torch.full((2, 3), float(r))[:, ::2]  # non-contiguous, reduced in place
    dist.all_reduce(x, "sum")
    out["strided"] = x.tolist()
    x = torch.ones(4) * r
    handle = dist.all_reduce(x, "mean", async_op=True)
    handle.wait()
    out["async mean"] = x.tolist()
    return out


def test_all_reduce(world):
    n = world.size
    ranks = range(n)
    results = world.run(_on_all_reduce)
    assert all(res == results[0] for res in results)
    got = results[0]
    assert got["sum"] == [sum(1.0 + r for r in ranks), sum(-2.0 * r for r in ranks)]
    assert got["product"][0] == float(np.prod([1.0 + r for r in ranks]))
    assert got["min"] == [1.0, -2.0 * (n - 1)] and got["max"] == [float(n), 0.0]
    assert got["mean"] == pytest.approx(
        [sum(1.0 + r for r in ranks) / n, sum(-2.0 * r for r in ranks) / n]
    )
    band = np.bitwise_and.reduce([r + 1 for r in ranks])
    bor = np.bitwise_or.reduce([2 * r + 3 for r in ranks])
    assert got["int band"] == (
        torch.int64,
        [int(band), 6, int(np.bitwise_and.reduce([2 * r + 3 for r in ranks]))],
    )
    assert got["int bor"][1][2] == int(bor)
    assert got["int bxor"][1][0] == int(np.bitwise_xor.reduce([r + 1 for r in ranks]))
    # mmengine: mean of an integer tensor is computed in float, written back truncated
    sums = [sum(r + 1 for r in ranks), 6 * n, sum(2 * r + 3 for r in ranks)]
    assert got["int mean"] == (torch.int64, [int(s / n) for s in sums])
    assert got["bool band"] == [n == 1, True]
    assert got["strided"] == [[float(sum(ranks))] * 2] * 2
    assert got["async mean"] == [sum(ranks) / n] * 4


def _on_autograd_and_expanded(comm):
    """In-place collectives on what torch.distributed takes: tensors in autograd, expanded."""
    r = comm.rank
    makers = {
        "loss": lambda: torch.tensor([1.0 + r], requires_grad=True) * 2,  # not a leaf
        "leaf": lambda: torch.tensor([1.0 + r], requires_grad=True),
        "expanded": lambda: torch.tensor([[1.0 + r], [5.0]]).expand(2, 3),
    }
    out = {}
    for strict in (True, False):
        c = dist.Communicator(strict=strict)
        for name, make in makers.items():
            for op in ("sum", "mean", "max"):
                x = make()
                c.all_reduce(x, op)
                out[(strict, name, op)] = x.tolist()
            x = make()
            c.broadcast(x, src=comm.world_size - 1)
            out[(strict, name, "broadcast")] = x.tolist()
            d = {"v": make()}
            dist.all_reduce_dict(d, "mean")
            out[(strict, name, "dict")] = d["v"].tolist()
    # the group goes on: nothing above broke it
    y = torch.ones(1)
    dist.all_reduce(y)
    out["after"] = y.item()
    return out


def test_autograd_and_expanded_tensors_reduce_in_place(world):
    n = world.size
    results = world.run(_on_autograd_and_expanded)
    assert all(res == results[0] for res in results)
    got = results[0]
    total = sum(1.0 + r for r in range(n))
    for strict in (True, False):
        assert got[(strict, "loss", "sum")] == [2 * total]
        assert got[(strict, "loss", "mean")] == pytest.approx([2 * total / n])
        assert got[(strict, "loss", "max")] == [2.0 * n]
        assert got[(strict, "loss", "broadcast")] == [2.0 * n]
        assert got[(strict, "leaf", "mean")] == pytest.approx([total / n])
        assert got[(strict, "leaf", "dict")] == pytest.approx([total / n])
        assert got[(strict, "expanded", "sum")] == [[total] * 3, [5.0 * n] * 3]
        assert got[(strict, "expanded", "max")] == [[float(n)] * 3, [5.0] * 3]
        assert got[(strict, "expanded", "broadcast")] == [[float(n)] * 3, [5.0] * 3]
        assert got[(strict, "expanded", "dict")][0] == pytest.approx([total / n] * 3)
    assert got["after"] == n


def _on_all_gather(comm, ragged):
    r = comm.rank
    t = torch.arange(r + 1 if ragged else 3, dtype=torch.float32) + 10 * r
    m = torch.full((r + 1 if ragged else 2, 2 + r % 2 if ragged else 2), r)
    return dist.all_gather(t), dist.all_gather(m)


@pytest.mark.parametrize("ragged", [False, True], ids=["same-shape", "ragged"])
def test_all_gather(world, ragged):
    n = world.size
    for vecs, mats in world.run(_on_all_gather, ragged):
        assert isinstance(vecs, list) and len(vecs) == n
        for r in range(n):
            expect = torch.arange(r + 1 if ragged else 3, dtype=torch.float32) + 10 * r
            assert torch.equal(vecs[r], expect)
            shape = (r + 1, 2 + r % 2) if ragged else (2, 2)
            assert torch.equal(mats[r], torch.full(shape, r))


def _on_all_gather_mismatch(comm):
    if comm.rank == comm.world_size - 1:
        return dist.all_gather(torch.ones(2, dtype=torch.int32))
    return dist.all_gather(torch.ones(2))


def test_all_gather_dtype_mismatch_fails_on_every_rank(multi_world):
    outcomes = multi_world.outcomes(_on_all_gather_mismatch)
    msgs = {str(o.error) for o in outcomes}
    assert all(isinstance(o.error, RemoteArgumentError) for o in outcomes)
    assert len(msgs) == 1 and "different dtypes" in msgs.pop()


def _on_flat_collectives(comm):
    r, n = comm.rank, comm.world_size
    out = torch.empty(2 * n, dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.tensor([r, -r]))
    gathered = dist.gather(torch.tensor([r * 1.5]), dst=n - 1)
    b = torch.tensor([r, r])
    dist.broadcast(b, src=n - 1)
    rs = torch.empty(2)
    dist.reduce_scatter(rs, torch.arange(2.0 * n) + r)
    rs_list = torch.empty(1, dtype=torch.int64)
    dist.reduce_scatter(rs_list, [torch.tensor([i * 10 + r]) for i in range(n)], "max")
    rs_mean = torch.empty(1)
    dist.reduce_scatter(rs_mean, torch.ones(n) * r, "mean")
    h = dist.broadcast(bb := torch.tensor([float(r)]), src=0, async_op=True)
    h.wait()
    dist.barrier()
    return (
        out.tolist(),
        [t.tolist() for t in gathered],
        b.tolist(),
        rs.tolist(),
        rs_list.tolist(),
        rs_mean.tolist(),
        bb.tolist(),
    )


def test_flat_collectives(world):
    n = world.size
    for r, got in enumerate(world.run(_on_flat_collectives)):
        out, gathered, b, rs, rs_list, rs_mean, bb = got
        assert out == [v for i in range(n) for v in (i, -i)]
        assert gathered == ([[i * 1.5] for i in range(n)] if r == n - 1 else [])
        assert b == [n - 1, n - 1]
        assert rs == [sum(2 * r + j + i for i in range(n)) for j in range(2)]
        assert rs_list == [r * 10 + n - 1]
        assert rs_mean == [sum(range(n)) / n]
        assert bb == [0.0]


def _on_gather_into_tensor(comm):
    r, n = comm.rank, comm.world_size
    flat = torch.full((2 * n,), -1.0) if r == n - 1 else None
    dist.gather_into_tensor(torch.tensor([r, r + 0.5]), flat, dst=n - 1)
    stacked = torch.zeros(n, 2, dtype=torch.int64)  # passed on every rank: written on dst
    comm.gather_into_tensor(torch.tensor([r, -r]), stacked, 0)
    return None if flat is None else flat.tolist(), stacked.tolist()


def test_gather_into_tensor(world):
    # added by following docs/architecture.md's recipe: torch 2.14's call, on 2.13 too
    n = world.size
    for r, (flat, stacked) in enumerate(world.run(_on_gather_into_tensor)):
        assert flat == ([v for i in range(n) for v in (i, i + 0.5)] if r == n - 1 else None)
        assert stacked == ([[i, -i] for i in range(n)] if r == 0 else [[0, 0]] * n)


def _on_gather_into_tensor_bad_output(comm):
    out = torch.zeros(comm.world_size + 1) if comm.rank == 0 else None
    comm.gather_into_tensor(torch.ones(1), out, 0)


def test_gather_into_tensor_refuses_a_wrong_output_on_every_rank(multi_world):
    # only dst reads its output: its mistake joins the first round, so no rank hangs
    outcomes = multi_world.outcomes(_on_gather_into_tensor_bad_output)
    assert all(isinstance(o.error, (ValueError, RemoteArgumentError)) for o in outcomes)
    assert "needs world_size" in str(outcomes[0].error)
    assert all(isinstance(o.error, RemoteArgumentError) for o in outcomes[1:])


def _on_objects(comm, big):
    r, n = comm.rank, comm.world_size
    payload = {
        "rank": r,
        "data": list(range(big * (r + 1))),
        "arr": np.arange(r + 3),
        "t": torch.full((2,), r),
    }
    gathered = dist.all_gather_object(payload)
    at_last = dist.gather_object(payload, dst=n - 1)
    objs = [f"from {r}", {"n": big}, None] if r == n - 1 else [None, None, None]
    dist.broadcast_object_list(objs, src=n - 1)
    one = dist.broadcast_object({"cfg": list(range(big))} if r == 0 else None, src=0)
    return gathered, at_last, objs, one


@pytest.mark.parametrize("big", [3, 5000], ids=["small", "overflow"])
def test_object_collectives(world, big):
    n = world.size
    for r, (gathered, at_last, objs, one) in enumerate(world.run(_on_objects, big)):
        assert isinstance(gathered, list) and len(gathered) == n
        for i, got in enumerate(gathered):
            assert got["rank"] == i and got["data"] == list(range(big * (i + 1)))
            assert np.array_equal(got["arr"], np.arange(i + 3))
            assert torch.equal(got["t"], torch.full((2,), i))
        if r == n - 1:
            assert [g["rank"] for g in at_last] == list(range(n))
        else:
            assert at_last is None
        assert objs == [f"from {n - 1}", {"n": big}, None]
        assert one == {"cfg": list(range(big))}


def _on_unpicklable_on_last(comm):
    obj = (lambda: 1) if comm.rank == comm.world_size - 1 else {"ok": comm.rank}
    return dist.all_gather_object(obj)


def test_serialization_failure_is_agreed(multi_world):
    outcomes = multi_world.outcomes(_on_unpicklable_on_last)
    last = multi_world.size - 1
    assert all(isinstance(o.error, RemoteError) for o in outcomes)
    assert len({str(o.error) for o in outcomes}) == 1
    assert outcomes[0].error.failures.keys() == {last}


def _on_broadcast_list_length_differs(comm):
    dist.broadcast_object_list([1, 2] if comm.rank == 0 else [None])


def test_broadcast_list_length_mismatch(multi_world):
    outcomes = multi_world.outcomes(_on_broadcast_list_length_differs)
    assert all(isinstance(o.error, RemoteArgumentError) for o in outcomes)
    assert "list length" in str(outcomes[0].error)


def _on_all_reduce_dict(comm):
    r = comm.rank
    d = {
        "loss": torch.tensor(1.0 + r),
        "acc": torch.tensor([r, 2 * r]),
        "map": torch.ones(2, 2) * r,
    }
    dist.all_reduce_dict(d, "sum")
    m = {"a": torch.tensor([2.0 * r]), "b": torch.tensor([3 * r + 1])}
    dist.all_reduce_dict(m, "mean")
    return {
        k: (v.dtype, v.tolist()) for k, v in {**d, **{"m" + k: v for k, v in m.items()}}.items()
    }


def test_all_reduce_dict(world):
    n = world.size
    s = sum(range(n))
    for got in world.run(_on_all_reduce_dict):
        assert got["loss"] == (torch.float32, float(n + s))
        assert got["acc"] == (torch.int64, [s, 2 * s])
        assert got["map"] == (torch.float32, [[float(s)] * 2] * 2)
        assert got["ma"] == (torch.float32, [2.0 * s / n])
        assert got["mb"] == (torch.int64, [int((3 * s + n) / n)])


def _on_dict_keys_differ(comm):
    d = {"loss": torch.tensor(1.0)}
    if comm.rank == 1:
        d["extra"] = torch.tensor(2.0)
    dist.all_reduce_dict(d)


def test_all_reduce_dict_keys_differ(multi_world):
    outcomes = multi_world.outcomes(_on_dict_keys_differ)
    assert all(isinstance(o.error, RemoteArgumentError) for o in outcomes)
    msg = str(outcomes[0].error)
    assert len({str(o.error) for o in outcomes}) == 1
    assert "'extra'" in msg and "rank 1" in msg


def _on_params(comm, coalesce, bucket):
    r = comm.rank
    params = [
        torch.nn.Parameter(torch.full((3,), float(r))),
        torch.full((2, 2), r + 1.0),
        torch.tensor([r], dtype=torch.int64),
        torch.full((5,), float(r), dtype=torch.float64),
    ]
    dist.all_reduce_params(iter(params), coalesce=coalesce, bucket_size_mb=bucket, op="mean")
    return [(p.dtype, p.data.tolist()) for p in params]


@pytest.mark.parametrize("coalesce,bucket", [(True, -1), (True, 1e-5), (False, -1)])
def test_all_reduce_params(world, coalesce, bucket):
    n = world.size
    m = sum(range(n)) / n
    for got in world.run(_on_params, coalesce, bucket):
        assert got[0] == (torch.float32, [m] * 3)
        assert got[1] == (torch.float32, [[m + 1] * 2] * 2)
        assert got[2] == (torch.int64, [int(m)])
        assert got[3] == (torch.float64, [m] * 5)


def _on_collect(comm, device, tmpdir):
    r, n = comm.rank, comm.world_size
    # a sampler's view: rank r holds samples r, r+n, ...; one rank holds a genuine None
    part = [i if i != 1 else None for i in range(r, 7, n)]
    with tempfile.TemporaryDirectory() as cwd:
        old = os.getcwd()
        os.chdir(cwd)
        try:
            res = dist.collect_results(part, 6, device=device, tmpdir=tmpdir)
            leftovers = os.listdir(cwd)
        finally:
            os.chdir(old)
    return res, leftovers


@pytest.mark.parametrize("device", ["cpu", "gpu", "cpu-tmpdir"])
def test_collect_results(world, device, tmp_path):
    tmpdir = str(tmp_path / "shared") if device == "cpu-tmpdir" else None
    results = world.run(_on_collect, device.split("-")[0], tmpdir)
    expect = [0, None, 2, 3, 4, 5]
    assert results[0][0] == expect
    assert all(res is None for res, _ in results[1:])
    assert all(left == [] for _, left in results)
    if tmpdir and world.size > 1:
        assert not os.path.exists(tmpdir)  # parts removed, then the directory left empty


def _on_collect_unshared(comm, mode, tmpdir):
    r = comm.rank
    real_isfile = os.path.isfile

    def blind(path):
        if mode == "rank1-blind" and r == 1 and path.endswith(".owner"):
            return False
        if mode == "rank0-blind" and r == 0 and path.endswith("part_1.pkl"):
            return False
        return real_isfile(path)

    with tempfile.TemporaryDirectory() as cwd:
        old = os.getcwd()
        os.chdir(cwd)
        try:
            with mock.patch("commlib.results.os.path.isfile", blind):
                try:
                    dist.collect_results_cpu([r], 2, tmpdir=tmpdir)
                    return "no error", []
                except RemoteError as exc:
                    return str(exc), os.listdir(cwd)
        finally:
            os.chdir(old)


@pytest.mark.parametrize("mode", ["rank1-blind", "rank0-blind"])
def test_collect_results_unshared_dir(multi_world, mode, tmp_path):
    tmpdir = str(tmp_path / "t") if mode == "rank0-blind" else None
    results = multi_world.run(_on_collect_unshared, mode, tmpdir)
    msgs = {m for m, _ in results}
    assert len(msgs) == 1
    msg = msgs.pop()
    assert "rank 1" in msg and "not shared" in msg
    assert all(left == [] for _, left in results)  # the unique tmpdir is gone


def _on_seed(comm):
    np.random.seed(100 + comm.rank)
    return dist.sync_random_seed()


def test_sync_random_seed(world):
    seeds = world.run(_on_seed)
    assert seeds == [int(np.random.RandomState(100).randint(2**31))] * world.size


def _on_mean_and_pad(comm):
    r = comm.rank
    x = torch.tensor([float(r), 2.0])
    m = dist.reduce_mean(x)
    sizes, padded = dist.pad_to_largest_tensor(torch.ones(r + 1, 2) * (r + 1))
    return x.tolist(), m.tolist(), sizes, padded.tolist()


def test_reduce_mean_and_pad(world):
    n = world.size
    for r, (x, m, sizes, padded) in enumerate(world.run(_on_mean_and_pad)):
        assert x == [float(r), 2.0]
        assert m == [sum(range(n)) / n, 2.0]
        assert sizes == list(range(1, n + 1))
        assert padded == [[r + 1.0] * 2] * (r + 1) + [[0.0, 0.0]] * (n - r - 1)


def _on_rank_zero_only(comm):
    calls = []

    @dist.rank_zero_only
    def f():
        calls.append(1)
        return "ran"

    @dist.master_only
    def g():
        return "main"

    return f(), g(), calls


def test_rank_zero_only(world):
    for r, (f, g, calls) in enumerate(world.run(_on_rank_zero_only)):
        assert (f, g, calls) == (("ran", "main", [1]) if r == 0 else (None, None, []))


def _on_subgroup(comm, members):
    sub = dist.new_group(members)
    r = comm.rank
    if not sub.is_member:
        errors = []
        for call in (
            lambda: dist.all_reduce(torch.ones(1), group=sub),
            lambda: dist.all_gather_object(1, group=sub),
            lambda: sub.barrier(),
            lambda: dist.broadcast(torch.ones(1), group=sub.group),
        ):
            try:
                call()
                errors.append(None)
            except NotInGroupError as exc:
                errors.append(str(exc))
        return "outside", sub.rank, sub.world_size, errors
    n = sub.world_size
    x = torch.tensor([float(r)])
    dist.all_reduce(x, group=sub)
    y = torch.tensor([float(r)])
    dist.all_reduce(y, "max", group=sub.group)  # a torch ProcessGroup works too
    objs = dist.all_gather_object({"world_rank": r}, group=sub)
    last = dist.gather_object(r, dst=n - 1, group=sub)
    b = torch.tensor([r])
    dist.broadcast(b, src=n - 1, group=sub)
    box = [r]
    dist.broadcast_object_list(box, src=n - 1, group=sub)
    d = {"k": torch.tensor(1.0)}
    dist.all_reduce_dict(d, group=sub)
    return (
        "inside",
        sub.rank,
        n,
        x.item(),
        y.item(),
        objs,
        last,
        b.item(),
        box[0],
        d["k"].item(),
        dist.get_rank(sub),
        dist.get_world_size(sub.group),
    )


@pytest.mark.parametrize("pick", ["first-last", "odd"])
def test_subgroups(multi_world, pick):
    n = multi_world.size
    members = [0, n - 1] if pick == "first-last" else list(range(1, n, 2))
    results = multi_world.run(_on_subgroup, members)
    k = len(members)
    for r, got in enumerate(results):
        if r not in members:
            assert got[:3] == ("outside", -1, -1)
            assert all(e is not None and "not a member" in e for e in got[3])
            continue
        g = members.index(r)
        _, grank, size, x, y, objs, last, b, box, d, grank2, size2 = got
        assert (grank, size, grank2, size2) == (g, k, g, k)
        assert x == sum(members) and y == max(members)
        assert objs == [{"world_rank": m} for m in members]
        assert last == (members if g == k - 1 else None)
        assert b == members[-1] and box == members[-1] and d == k


def _on_subgroup_of_subgroup(comm):
    r = comm.rank
    sub = comm.new_group(list(range(1, comm.world_size)))
    inner = sub.new_group(list(range(min(2, comm.world_size - 1))))  # members of sub or not
    got: tuple = (inner.is_member, inner.rank)
    if inner.is_member:
        x = torch.tensor([float(r)])
        inner.all_reduce(x)
        got += (x.item(),)
    try:  # ranks that differ on one rank: an error everywhere, not a wrong group
        comm.new_group([0, 1] if r else [1, 0, 2][: comm.world_size])
        got += ("no error",)
    except RemoteArgumentError as exc:
        got += ("new_group ranks passed different arguments" in str(exc),)
    return got


def test_subgroups_of_subgroups_and_ranks_that_differ(multi_world):
    # a non-member of a subgroup used to pass its group ranks as world ranks to torch,
    # which then waited for it without a bound
    results = multi_world.run(_on_subgroup_of_subgroup)
    inner = list(range(1, min(3, multi_world.size)))  # world ranks of sub's first two
    for r, got in enumerate(results):
        if r in inner:
            assert got == (True, inner.index(r), float(sum(inner)), True)
        else:
            assert got == (False, -1, True)


def _on_ranks_out_of_order(comm):
    # torch numbers [3, 2] as [2, 3]; the non-members' view of it must too, or
    # dividing it names other world ranks there than on the members
    n = comm.world_size
    outer = comm.new_group([n - 1, n - 2])
    inner = outer.new_group([0])
    x = torch.ones(1)
    if inner.is_member:
        inner.all_reduce(x)
    return outer.rank, inner.is_member


def test_a_group_given_its_ranks_out_of_order_divides_alike_on_every_rank(multi_world):
    n = multi_world.size
    results = multi_world.run(_on_ranks_out_of_order)
    members = [n - 2, n - 1]
    for r, (outer_rank, in_inner) in enumerate(results):
        assert outer_rank == (members.index(r) if r in members else -1)
        assert in_inner == (r == n - 2)


def _on_destroyed_group(comm):
    import torch.distributed as tdist

    pg = tdist.new_group(list(range(comm.world_size)))
    held = dist.Communicator(pg)
    x = torch.ones(1)
    dist.all_reduce(x, group=pg)
    tdist.destroy_process_group(pg)
    out = [x.item()]
    for call in (
        lambda: dist.all_reduce(torch.ones(1), group=pg),
        lambda: dist.broadcast(torch.ones(1), src=0, group=pg),
        lambda: dist.get_rank(pg),
        lambda: held.ranks,
    ):
        try:
            call()
            out.append("no error")
        except ValueError as exc:  # torch's own calls raise ValueError here too
            out.append("destroy_process_group" in str(exc))
    return out


def test_a_destroyed_group_is_a_clear_error(multi_world):
    # these were raw KeyErrors (the group rank translation), or a stale get_rank
    n = multi_world.size
    assert multi_world.run(_on_destroyed_group) == [[float(n), True, True, True, True]] * n


def _on_raise(comm):
    if comm.rank == 0:
        raise KeyError("boom")
    return comm.rank


def test_harness_reports_rank_failures(world2):
    with pytest.raises(RankFailed, match="boom"):
        world2.run(_on_raise)
    assert world2.run(_on_identity)[1][0] == 1  # the world is still usable


def _on_all_gather_sizes(comm):
    r = comm.rank
    out = {}
    for dtype in (torch.bool, torch.bfloat16, torch.complex64, torch.int8, torch.float64):
        t = (torch.arange(r + 2) % 2).to(dtype)
        out[str(dtype)] = [(g.dtype, g.tolist()) for g in dist.all_gather(t)]
    big_same = torch.full((3000,), float(r))  # 12 KB: past the first round's slot
    big_ragged = torch.full((2000 + 500 * r, 2), r, dtype=torch.int32)
    out["big_same"] = [g.sum().item() for g in dist.all_gather(big_same)]
    out["big_ragged"] = [tuple(g.shape) for g in dist.all_gather(big_ragged)]
    out["scalar"] = [g.item() for g in dist.all_gather(torch.tensor(r * 1.5))]
    out["empty"] = [tuple(g.shape) for g in dist.all_gather(torch.empty(0, r + 1))]
    return out


def test_all_gather_dtypes_and_sizes(world):
    n = world.size
    for got in world.run(_on_all_gather_sizes):
        for dtype in (torch.bool, torch.bfloat16, torch.complex64, torch.int8, torch.float64):
            assert got[str(dtype)] == [
                (dtype, (torch.arange(r + 2) % 2).to(dtype).tolist()) for r in range(n)
            ]
        assert got["big_same"] == [3000.0 * r for r in range(n)]
        assert got["big_ragged"] == [(2000 + 500 * r, 2) for r in range(n)]
        assert got["scalar"] == [r * 1.5 for r in range(n)]
        assert got["empty"] == [(0, r + 1) for r in range(n)]


def _on_large_complex(comm):
    # past the check's slot: gloo's own reduce and gather (torch's gather refuses complex)
    r, n = comm.rank, comm.world_size
    x = torch.full((30000,), complex(r + 1, 1), dtype=torch.complex64)
    reduced = x.clone()
    dist.reduce(reduced, dst=n - 1)
    gathered = dist.gather(x, dst=0)
    return reduced[:2].tolist(), [g[:2].tolist() for g in gathered]


def test_reduce_and_gather_of_complex_tensors_past_the_slot(world3):
    n = world3.size
    total = complex(sum(range(1, n + 1)), n)
    for r, (reduced, gathered) in enumerate(world3.run(_on_large_complex)):
        if r == n - 1:
            assert reduced == [total] * 2
        assert gathered == ([[complex(q + 1, 1)] * 2 for q in range(n)] if r == 0 else [])


_ODD_DTYPES = ("int16", "uint16", "uint32", "uint64", "float8_e4m3fn")


def _on_dtypes_gloo_lacks(comm):
    r, n = comm.rank, comm.world_size
    out = {}
    for name in _ODD_DTYPES:
        dtype = getattr(torch, name)
        x = torch.tensor([r + 1, 2], dtype=torch.float32).to(dtype)
        s = x.clone()
        dist.all_reduce(s, "sum")
        m = x.clone()
        dist.all_reduce(m, "max")
        b = x.clone()
        dist.broadcast(b, src=n - 1)
        g = dist.all_gather(x)
        a = torch.tensor([2 * (r + 1), 4], dtype=torch.float32).to(dtype)
        dist.all_reduce(a, "mean")  # float8 has no division of its own
        out[name] = [
            s.float().tolist(),
            m.float().tolist(),
            b.float().tolist(),
            [t.float().tolist() for t in g],
            a.float().tolist(),
        ]
    return out


def test_dtypes_gloo_cannot_move(world):
    # gloo itself rejects these ("Invalid scalar type"); the plugin supplies them
    n = world.size
    for got in world.run(_on_dtypes_gloo_lacks):
        for name in _ODD_DTYPES:
            s, m, b, g, a = got[name]
            assert s == [float(sum(range(1, n + 1))), 2.0 * n], name
            assert a == [float(n + 1), 4.0] or name.startswith(("int", "uint")), (name, a)
            assert m == [float(n), 2.0] and b == [float(n), 2.0], name
            assert g == [[r + 1.0, 2.0] for r in range(n)], name


def _on_poll_until_completed(comm):
    import time

    c = dist.Communicator()
    out = []
    for n in (4, 100_000):  # within the check's round, and past it
        x = torch.ones(n)
        handle = c.all_reduce(x, async_op=True)
        deadline = time.monotonic() + 20
        while not handle.is_completed() and time.monotonic() < deadline:
            time.sleep(0.001)
        out.append((handle.is_completed(), handle.wait(), x[0].item()))
    return out


def test_polling_is_completed_ends_as_with_torch_work(world2):
    for got in world2.run(_on_poll_until_completed):
        assert got == [(True, True, 2.0)] * 2


def _on_torch_p2pops(comm):
    import torch.distributed as tdist

    r, n = comm.rank, comm.world_size
    got = torch.zeros(2)
    ops = [
        tdist.P2POp(tdist.isend, torch.full((2,), float(r)), (r + 1) % n),
        tdist.P2POp(tdist.irecv, got, (r - 1) % n),
    ]
    for handle in dist.batch_isend_irecv(ops):  # torch's P2POp fills peer and group_peer
        handle.wait()
    return got.tolist()


def test_batch_isend_irecv_takes_torchs_own_p2pops(world3):
    n = world3.size
    assert world3.run(_on_torch_p2pops) == [[float((r - 1) % n)] * 2 for r in range(n)]


def _on_collect_with_numpy_size(comm):
    import numpy as np

    c = dist.Communicator()
    size = np.int64(c.world_size + 1)  # mmengine only slices with it
    return [
        dist.results.collect_results_gpu(c, [c.rank, 10 + c.rank], size),
        dist.results.collect_results_cpu(c, [c.rank, 10 + c.rank], size),
    ]


def test_collect_results_takes_a_numpy_size(world2):
    first, second = world2.run(_on_collect_with_numpy_size)
    assert first == [[0, 1, 10], [0, 1, 10]] and second == [None, None]


def _on_adapt_empty(comm):
    r = comm.rank
    out = {}
    strict = dist.Communicator(strict=True)  # its check round describes no dtype for these calls
    for size, c in ((3, comm), (3000, comm), (3, strict)):  # in the first round, past it
        # rank 1 saw no data: torchmetrics' placeholder, float32 and 1-D
        t = torch.tensor([]) if r == 1 else torch.full((size + r, 2), r, dtype=torch.int64)
        got = c.all_gather(t, adapt_empty=True)
        out[(size, c is strict)] = [(g.dtype, tuple(g.shape), g.sum().item()) for g in got]
    try:  # without it the placeholder is a mismatch, on every rank
        comm.all_gather(torch.tensor([]) if r == 1 else torch.ones(2, 2, dtype=torch.int64))
    except RemoteArgumentError as exc:
        out["plain"] = str(exc)
    every = comm.all_gather(torch.empty(0, 3), adapt_empty=True)  # nothing to adapt to
    out["all_empty"] = [(g.dtype, tuple(g.shape)) for g in every]
    loose = dist.Communicator(strict=False)
    for c, label in ((comm, "mixed"), (loose, "mixed_unchecked")):
        # only rank 0 adapts: it alone could take rank 1's placeholder
        t = torch.tensor([]) if r == 1 else torch.ones(2, 2, dtype=torch.int64)
        try:
            c.all_gather(t, adapt_empty=r == 0)
        except RemoteArgumentError as exc:
            out[label] = str(exc)
    out["after"] = [g.tolist() for g in comm.all_gather(torch.tensor([r]))]  # still in step
    return out


def test_all_gather_adapt_empty_takes_the_dtype_and_dims_of_the_ranks_with_data(multi_world):
    n = multi_world.size
    for got in multi_world.run(_on_adapt_empty):
        for size, strict in ((3, False), (3000, False), (3, True)):
            assert got[(size, strict)] == [
                (torch.int64, (0, 2), 0)
                if r == 1
                else (torch.int64, (size + r, 2), (size + r) * 2 * r)
                for r in range(n)
            ]
        assert "different dtypes or ndims" in got["plain"]
        assert "rank 1: dtype=torch.float32, ndim=1" in got["plain"]
        assert got["all_empty"] == [(torch.float32, (0, 3))] * n
        for label in ("mixed", "mixed_unchecked"):
            assert "different adapt_empty" in got[label], got
            assert "rank 0: adapt_empty=True" in got[label]
            assert "rank 1: adapt_empty=False" in got[label]
        assert got["after"] == [[r] for r in range(n)]
