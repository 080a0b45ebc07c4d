"""FSDP2, a 2-D DeviceMesh with DTensor, torch.distributed.checkpoint and torch's object
collectives on torch backends commlib serves, at 2 and 4 ranks.

Each runs on plain gloo groups and on ``commlib-gloo`` groups in the session's gloo
worlds (the same results; commlib's recorder saw the second run's collectives), and on
``commlib-mpi`` groups in the mpi kit's ranks (slow: one mpiexec per size).
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import get_world
from tests.torch_programs import api_checks
from tests.torch_programs.mpi_kit import mpi_kit

SIZES = [2, 4]


def _close(a: list[float], b: list[float]) -> bool:
    return bool((torch.tensor(a) - torch.tensor(b)).abs().max() < 1e-6)


def _same_on_every_rank(results: list[dict]) -> None:
    assert all(r["value"] == results[0]["value"] for r in results), results


def _check_fsdp2(results: list[dict], reference: list[dict]) -> None:
    _same_on_every_rank(results)
    assert _close(results[0]["value"], reference[0]["value"])
    # parameters gathered and gradients scattered: through commlib
    for r in results:
        assert {"all_gather_into_tensor", "reduce_scatter"} <= set(r["seen"]), r["seen"]


def _check_mesh(results: list[dict], reference: list[dict]) -> None:
    for ours, theirs in zip(results, reference):
        assert ours["value"]["groups"] == ["CommlibProcessGroup"], ours
        assert ours["value"]["whole"] and ours["value"]["total"] == theirs["value"]["total"]
        for key in ("rows", "cols", "both"):
            assert ours["value"][key] == theirs["value"][key], key  # each rank's shard
        assert ours["seen"], "DTensor's collectives did not go through commlib"


def _check_checkpoint(results: list[dict]) -> None:
    for r in results:
        assert r["value"] == {"same": True, "step": 7}, r
        assert r["seen"], "DCP's collectives did not go through commlib"


def _check_objects(results: list[dict], reference: list[dict]) -> None:
    assert [r["value"] for r in results] == [r["value"] for r in reference]
    size = len(results)
    assert results[0]["value"]["gathered"] == [["r", i] for i in range(size)] or results[0][
        "value"
    ]["gathered"] == [("r", i) for i in range(size)]
    assert results[-1]["value"]["received"] == [{"to": size - 1}]
    for r in results:
        assert "all_gather" in " ".join(r["seen"]) and "broadcast" in r["seen"], r["seen"]


# -- gloo worlds: plain gloo beside commlib-gloo ------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_fsdp2_trains_on_commlib_gloo_as_on_gloo(size):
    world = get_world(size)
    reference = world.run(api_checks.fsdp2, "gloo")
    _check_fsdp2(world.run(api_checks.fsdp2, "commlib-gloo"), reference)


@pytest.mark.parametrize("size", SIZES)
def test_dtensor_redistributes_on_a_2d_mesh_of_commlib_gloo_groups(size):
    world = get_world(size)
    reference = world.run(api_checks.mesh_2d, "gloo")
    _check_mesh(world.run(api_checks.mesh_2d, "commlib-gloo"), reference)


@pytest.mark.parametrize("size", SIZES)
def test_dcp_saves_and_loads_on_commlib_gloo(size, tmp_path):
    _check_checkpoint(get_world(size).run(api_checks.checkpoint, "commlib-gloo", str(tmp_path)))


@pytest.mark.parametrize("size", SIZES)
def test_torch_object_collectives_on_commlib_gloo(size):
    world = get_world(size)
    reference = world.run(api_checks.object_collectives, "gloo")
    _check_objects(world.run(api_checks.object_collectives, "commlib-gloo"), reference)


# -- the mpi kit: commlib-mpi beside a gloo group in the same ranks ------------------------
# 4 first: test_ddp.py left the kit's 4 ranks running (tests/torch_programs/mpi_kit.py)
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("size", SIZES[::-1])
def test_torch_apis_on_commlib_mpi(size, tmp_path):
    kit = mpi_kit()
    reference = kit.call(size, api_checks.fsdp2, "gloo")
    _check_fsdp2(kit.call(size, api_checks.fsdp2, "commlib-mpi"), reference)
    reference = kit.call(size, api_checks.mesh_2d, "gloo")
    _check_mesh(kit.call(size, api_checks.mesh_2d, "commlib-mpi"), reference)
    _check_checkpoint(kit.call(size, api_checks.checkpoint, "commlib-mpi", str(tmp_path)))
    reference = kit.call(size, api_checks.object_collectives, "gloo")
    _check_objects(kit.call(size, api_checks.object_collectives, "commlib-mpi"), reference)
