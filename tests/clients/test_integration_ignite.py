"""PyTorch-Ignite's ``ignite.distributed`` on commlib (issue 34), against the real ignite.

ignite's own checks of idist (re-expressed in ``tests/clients/ignite_checks.py``
so that they return what they saw) run in the same ranks under ignite's
native model and under :class:`~commlib.integrations.ignite.CommlibModel`,
and the two must see the same values, types, dtypes and exceptions: on gloo
worlds of 1, 2 and 3 ranks, on a simulated Ascend NPU (the hccl plugin) at 2
ranks, and on the ``single`` backend in this process (against the native
model at one rank). An ignite ``Engine`` evaluation loop with metrics
synced across ranks computes what the native model computes, which is what
one process computes over all the data.

Functions named ``_on_*`` run inside the harness's ranks (``fn(comm, ...)``).
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

pytest.importorskip(
    "ignite", reason="pytorch-ignite is not installed (pip install -e '.[integrations]')"
)

import ignite.distributed as idist
from ignite.distributed.comp_models import _SerialModel
from ignite.distributed.comp_models.base import ComputationModel
from ignite.distributed.comp_models.native import _NativeDistModel
from ignite.distributed.utils import _set_model
from ignite.engine import Engine
from ignite.metrics import Accuracy, ConfusionMatrix, Loss, Precision

from commlib import Communicator
from commlib.integrations.ignite import CommlibModel, use_commlib
from commlib.testing import World, simulated
from tests.clients import ignite_checks
from tests.conftest import get_world


def _under(model, fn, *args):
    _set_model(model)
    try:
        return fn(*args)
    finally:
        _set_model(_SerialModel())


def _on_both(comm, fn, *args):
    """``fn`` under ignite's native model, then under commlib's, in this rank."""
    native = _NativeDistModel.create_from_context()
    return {
        "native": _under(native, fn, *args),
        "commlib": _under(CommlibModel(comm), fn, *args),
    }


def _on_checks(comm):
    return _on_both(comm, ignite_checks.run_checks)


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda n: f"world{n}")
def world(request) -> World:
    return get_world(request.param)


def test_ignite_checks_see_what_the_native_model_sees(world):
    per_rank = world.run(_on_checks)
    for rank, got in enumerate(per_rank):
        assert set(got["commlib"]) == set(got["native"])
        for check, native in got["native"].items():
            assert got["commlib"][check] == native, f"rank {rank}, check {check}"
    if world.size > 1:  # the checks that need ranks ran
        assert "all_gather_group" in per_rank[0]["commlib"]


def _on_simulated_checks(comm):
    # torch's own barrier cannot run on the simulation (it asks the device's runtime
    # hooks, which a simulated device lacks): the native model skips the checks that
    # call it; commlib's runs them all (they assert their results themselves)
    native = _NativeDistModel.create_from_context()
    return {
        "native": _under(native, ignite_checks.run_checks, ignite_checks.BARRIER_CHECKS),
        "commlib": _under(CommlibModel(comm), ignite_checks.run_checks),
        "backend": comm.backend,
    }


@pytest.mark.timeout(180)
def test_on_a_simulated_npu_too():
    # the hccl plugin on a simulated Ascend NPU (gloo stands in for HCCL below it)
    setup = simulated.setup("hccl", devices=2)
    with World(2, backend="hccl", setup=setup, timeout=90) as sim:
        per_rank = sim.run(_on_simulated_checks)
    for got in per_rank:
        assert got["backend"] == "hccl"
        assert set(got["commlib"]) == {*got["native"], *ignite_checks.BARRIER_CHECKS}
        for check, native in got["native"].items():
            assert got["commlib"][check] == native, check


def test_single_backend_sees_what_the_native_model_sees_at_one_rank(fresh_commlib_state):
    # no process group here: commlib's single backend, against native at one gloo rank
    (reference,) = get_world(1).run(_on_checks)
    model = use_commlib()
    try:
        assert idist.model_name() == "commlib" and idist.backend() == "single"
        got = ignite_checks.run_checks()
    finally:
        _set_model(_SerialModel())
    assert isinstance(model, CommlibModel) and model.comm.backend == "single"
    assert got == reference["native"]


# -- an Engine: an evaluation loop whose metrics sync across ranks -----------------------------
N, CLASSES = 11, 3  # 11 samples: the ranks' shares are uneven


def _data():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(N, CLASSES, generator=g)
    labels = torch.randint(0, CLASSES, (N,), generator=g)
    return logits, labels


def _evaluate():
    logits, labels = _data()
    rank, ws = idist.get_rank(), idist.get_world_size()
    mine = list(range(rank, N, ws))
    batches = [(logits[mine[j : j + 2]], labels[mine[j : j + 2]]) for j in range(0, len(mine), 2)]
    evaluator = Engine(lambda engine, batch: batch)
    Accuracy().attach(evaluator, "accuracy")
    Loss(torch.nn.functional.cross_entropy).attach(evaluator, "loss")
    Precision(average=False).attach(evaluator, "precision")
    ConfusionMatrix(num_classes=CLASSES).attach(evaluator, "confusion")
    metrics = evaluator.run(batches).metrics
    return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}


def _on_engine(comm):
    return _on_both(comm, _evaluate)


def test_an_engine_evaluates_across_ranks_as_with_the_native_model(world):
    if world.size == 1:
        pytest.skip("the metrics sync across ranks: 2 and 3 ranks")
    per_rank = world.run(_on_engine)
    alone = _under(_SerialModel(), _evaluate)  # every sample in one process
    for got in per_rank:
        for model in ("native", "commlib"):
            # counts exactly; float sums added in another order may differ in the last bit
            assert got[model]["accuracy"] == alone["accuracy"]
            assert got[model]["confusion"] == alone["confusion"]
            assert got[model]["loss"] == pytest.approx(alone["loss"], rel=1e-6)
            assert got[model]["precision"] == pytest.approx(alone["precision"], rel=1e-6)
        assert set(got["commlib"]) == set(got["native"]) == set(alone)


# -- where a rank is, without a launcher's LOCAL_RANK -------------------------------------------
def _where(model):
    return (
        model.get_local_rank(),
        model.get_nproc_per_node(),
        model.get_nnodes(),
        model.get_node_rank(),
    )


def _on_without_local_rank(comm):
    saved = os.environ.pop("LOCAL_RANK")
    try:
        out = {}
        with warnings.catch_warnings():  # native warns that it guesses from the hostnames
            warnings.simplefilter("ignore")
            out["hostnames"] = (
                _where(_NativeDistModel.create_from_context()),
                _where(CommlibModel(comm)),
            )
        idist.set_local_rank(comm.world_size - 1 - comm.rank)  # the user says
        out["set_local_rank"] = (
            _where(_NativeDistModel.create_from_context()),
            _where(CommlibModel(comm)),
        )
        return out
    finally:
        os.environ["LOCAL_RANK"] = saved
        ComputationModel._ext_local_rank = None


def test_local_rank_from_the_hostnames_or_set_local_rank_as_native(world3):
    got = world3.run(_on_without_local_rank)
    for rank, where in enumerate(got):
        for native, ours in where.values():
            assert ours == native
        assert where["hostnames"][1] == (rank, 3, 1, 0)  # one machine: local ranks 0, 1, 2
        assert where["set_local_rank"][1] == (2 - rank, 3, 1, 0)


# -- what only commlib's model does, and its arguments ----------------------------------------
def _on_groups(comm):
    model = use_commlib()
    try:
        rank, ws = idist.get_rank(), idist.get_world_size()
        members = list(range(1, ws))
        made = idist.new_group(members)
        # a list names the group new_group made for it: the members alone may use it
        if rank in members:
            assert model._group_comm(members) is made
            summed = idist.all_reduce(rank, group=members)
        else:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                summed = idist.all_reduce(rank, group=members)
            assert "not a member" in str(caught[0].message)
        # a torch group and a commlib communicator are groups too
        world_pg = comm.group
        everyone = idist.all_gather(rank, group=world_pg)
        # ranks whose tensors differ in their first dim: concatenated
        uneven = idist.all_gather(torch.full((rank + 1,), rank))
        # every dtype, also those gloo lacks
        small = idist.all_reduce(torch.tensor([rank], dtype=torch.int16), "MAX")
        with pytest.raises(TypeError, match=r"commlib takes ranks and timeout only"):
            idist.new_group(members, pg_options="x")
        whole = idist.new_group([])  # torch's: the world
        return summed, everyone, uneven.tolist(), small.tolist(), whole.world_size
    finally:
        _set_model(_SerialModel())


def test_groups_dtypes_and_uneven_gathers(world3):
    got = world3.run(_on_groups)
    assert got[0][0] == 0 and got[1][0] == got[2][0] == 3  # rank 0 is not a member
    assert all(g[1] == [0, 1, 2] for g in got)
    assert all(g[2] == [0, 1, 1, 2, 2, 2] for g in got)
    assert all(g[3] == [2] and g[4] == 3 for g in got)


def _on_lone_mistakes(comm):
    use_commlib()
    try:
        out = []
        rank = idist.get_rank()
        mistakes = [
            lambda: idist.all_reduce(rank, op="ABC" if rank == 1 else "SUM"),
            lambda: idist.all_reduce("abc" if rank == 1 else rank),
            lambda: idist.broadcast(None if rank == 0 else torch.zeros(2), src=0),
            lambda: idist.broadcast([rank] if rank == 1 else "x", src=0),
            lambda: idist.broadcast(None if rank == 1 else 1.5, src=0, safe_mode=False),
        ]
        for mistake in mistakes:
            try:
                mistake()
                out.append("no error")
            except (ValueError, TypeError) as exc:
                out.append(type(exc).__name__)
        # the world is whole afterwards
        out.append(idist.all_reduce(1))
        return out
    finally:
        _set_model(_SerialModel())


def test_a_mistake_only_one_rank_made_is_an_error_on_every_rank(world3):
    # ignite's native model raises on that rank alone and leaves the others waiting
    got = world3.run(_on_lone_mistakes)
    assert got == [["RemoteArgumentError"] * 5 + [3]] * 3


def test_arguments_are_checked(fresh_commlib_state):
    with pytest.raises(TypeError, match="runs on a commlib Communicator"):
        CommlibModel("world")
    with pytest.raises(NotImplementedError, match="torchrun"):
        CommlibModel.spawn(print, args=())
    with pytest.raises(ValueError, match="no launcher"):
        CommlibModel.create_from_backend("gloo")
    model = CommlibModel(Communicator())
    assert model.get_nnodes() == model.get_nproc_per_node() == 1 and model.get_node_rank() == 0
    assert isinstance(CommlibModel.create_from_context(), CommlibModel)
    with pytest.raises(ValueError, match="Argument group should be list of int"):
        model.all_reduce(torch.ones(1), "SUM", group=3.5)
    with pytest.raises(ValueError, match="Unsupported reduction operation: 'sum'"):
        model.all_reduce(torch.ones(1), "sum")  # idist's names only, as the native model
