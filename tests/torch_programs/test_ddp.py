"""DDP on torch backends commlib serves (``commlib-gloo``, ``commlib-mpi``) at 2 and 4 ranks.

The gloo runs use the session's gloo worlds (tests/conftest.py): their
default group is plain gloo, so the same DDP run on it is the reference, in
the same ranks. The mpi runs use the mpi kit's ranks (one ``mpiexec`` per
size), whose default group is ``mpi4py``; their reference is a plain gloo
group made there.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from commlib.torch_backend import registration
from tests.conftest import get_world
from tests.torch_programs import ddp_checks
from tests.torch_programs.mpi_kit import mpi_kit


# -- registration: no ranks ---------------------------------------------------------------
def test_every_commlib_name_is_a_torch_backend_after_import_commlib():
    # torch 2.13 finds the names through `import commlib`, and the mpi plugin's group
    # through the plugin's module
    import commlib_backends.mpi  # noqa: F401

    for name in ("commlib", "commlib-gloo", "commlib-mpi", "commlib-nccl", "mpi4py"):
        assert name in dist.Backend.backend_list, name
    # and none became torch's own choice for a device
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"


def test_the_names_are_torch_entry_points_of_this_distribution():
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group="torch.distributed.backends")}
    for name in ("commlib", "commlib-gloo", "commlib-mpi"):
        assert found.get(name) == "commlib.torch_backend.registration:register_all", found
    assert found.get("mpi4py") == "commlib_backends.mpi:register_torch_backend", found


def test_a_name_says_its_plugin_and_a_colon_is_no_name():
    assert registration.commlib_name("mpi") == "commlib-mpi"
    assert registration.plugin_of("commlib-gloo") == "gloo"
    assert registration.plugin_of("commlib") is None
    with pytest.raises(ValueError, match="not a commlib torch backend"):
        registration.plugin_of("gloo")


# -- DDP on commlib-gloo, beside plain gloo in the same ranks ------------------------------
def _check_ddp(results: list[dict], reference: list[dict]) -> None:
    weights = [r["weights"] for r in results]
    assert all(w == weights[0] for w in weights)  # every rank the same weights
    # as the same run on plain gloo, to float rounding (gloo's sums at 4 ranks follow its
    # own order per call)
    diff = (torch.tensor(weights[0]) - torch.tensor(reference[0]["weights"])).abs().max()
    assert diff < 1e-6, diff
    for r in results:
        names = [name for name, _ in r["seen"]]
        # DDP's start (its model check, the broadcast of rank 0's weights) and its
        # gradient buckets (one the first step, two after DDP rebuilt them) went through commlib
        assert names[0] == "all_gather_into_tensor" and "broadcast" in names, names
        assert names.count("all_reduce") == 1 + 2 + 2, names
    assert reference[0]["seen"] == []  # plain gloo: nothing of commlib's


@pytest.mark.parametrize("size", [2, 4])
def test_ddp_trains_on_commlib_gloo_as_on_gloo(size):
    world = get_world(size)
    reference = world.run(ddp_checks.train_ddp, "gloo")
    results = world.run(ddp_checks.train_ddp, "commlib-gloo")
    _check_ddp(results, reference)


def test_ddp_with_buckets_in_flight_together_on_commlib_gloo():
    # buckets of 1 MiB: each goes to the engine on its own (too big to travel in the
    # check's round), several in flight at once while backward goes on
    world = get_world(2)
    reference = world.run(ddp_checks.train_ddp, "gloo", 2, 512, 1.0)
    results = world.run(ddp_checks.train_ddp, "commlib-gloo", 2, 512, 1.0)
    assert all(r["weights"] == results[0]["weights"] for r in results)
    diff = (torch.tensor(results[0]["weights"]) - torch.tensor(reference[0]["weights"])).abs()
    assert diff.max() < 1e-6, diff.max()
    assert sum(1 for name, _ in results[0]["seen"] if name == "all_reduce") > 2


@pytest.mark.parametrize("init_sync", [True, False], ids=["at-start", "in-bucket"])
def test_a_model_differing_on_one_rank_is_one_error_on_every_rank(init_sync):
    world = get_world(2)
    results = world.run(ddp_checks.differing_model, "commlib-gloo", init_sync, timeout=90)
    kinds = {kind for kind, _, _ in results}
    assert kinds == {"RemoteArgumentError"}, results
    assert len({text for _, text, _ in results}) == 1, results  # the same error
    text = results[0][1]
    assert "torch.float32" in text and "torch.float64" in text, text
    # at start DDP broadcasts the weights; without, the first gradient bucket fails
    assert ("broadcast" if init_sync else "all_reduce") in text, text
    assert all(seconds < 60 for _, _, seconds in results), results


# -- DDP on commlib-mpi, in the mpi kit's ranks (one mpiexec per size) ----------------------
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", [2, 4])
def test_ddp_trains_on_commlib_mpi_as_on_gloo(size):
    kit = mpi_kit()
    reference = kit.call(size, ddp_checks.train_ddp, "gloo")
    results = kit.call(size, ddp_checks.train_ddp, "commlib-mpi")
    _check_ddp(results, reference)


# -- a commlib group's end ------------------------------------------------------------------
@pytest.mark.timeout(180)
@pytest.mark.parametrize("with_ddp", [False, True], ids=["collectives", "ddp-outliving-it"])
def test_a_destroyed_commlib_group_takes_its_engine_group_with_it(with_ddp):
    # destroy_process_group(group) left the plugin's own gloo group in torch's registry
    # (3 threads and 5 sockets a group). With DDP outliving the group, the reducer frees the
    # group's last reference holding the GIL: a plain gloo group freed that way can hang
    # for ever (torch's reducer does not let go of the GIL while gloo's threads finish,
    # reproduced in the benchmark); a commlib group must go without a hang
    world = get_world(2)
    results = world.run(
        ddp_checks.make_and_destroy_groups, "commlib-gloo", 6, with_ddp, timeout=150
    )
    for r in results:
        groups_before, threads_before = r["before"]
        groups_after, threads_after = r["after"]
        assert groups_after == groups_before, r
        assert threads_after <= threads_before + 1, r  # not 3 a group, 18
