"""torch programs on ``commlib-nccl``/``-hccl``/``-cncl`` over the simulated accelerators.

The plugins' real code (device selection, availability, their collectives)
over a simulated vendor runtime whose engine gloo plays and whose "device
memory" is host memory (:mod:`commlib.testing.simulated`): DDP, FSDP2,
torch's object collectives and (at 4 ranks) a 2-D DeviceMesh with DTensor
give what the same programs give on plain gloo groups in the same ranks,
and commlib's recorder saw their collectives. What the simulation cannot
show, tensors on the accelerator's own device type, needs the hardware
(docs/torch-programs.md).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from commlib.testing import World, simulated
from commlib.torch_backend import communicator_of
from tests.torch_programs import api_checks, ddp_checks

# slow: each case starts a world of its own (the simulation changes torch for good)
pytestmark = pytest.mark.slow


def programs(comm: Any, kind: str) -> dict[str, Any]:
    """In each rank: the programs on ``commlib-KIND`` and on plain gloo, side by side."""
    backend = f"commlib-{kind}"
    served = communicator_of(ddp_checks.group_of(backend))
    t = torch.full((2,), float(dist.get_rank() + 1))
    dist.all_reduce(t, group=ddp_checks.group_of(backend))
    out: dict[str, Any] = {"plugin": served.backend, "all_reduce": t.tolist()}
    for name, run in (("ddp", ddp_checks.train_ddp), ("fsdp2", api_checks.fsdp2)):
        ours, theirs = run(comm, backend), run(comm, "gloo")
        out[name] = (ours["weights" if name == "ddp" else "value"], ours["seen"])
        out[name + "_gloo"] = theirs["weights" if name == "ddp" else "value"]
    out["objects"] = api_checks.object_collectives(comm, backend)["value"]
    out["objects_gloo"] = api_checks.object_collectives(comm, "gloo")["value"]
    if dist.get_world_size() == 4:
        out["mesh"] = api_checks.mesh_2d(comm, backend)["value"]
        out["mesh_gloo"] = api_checks.mesh_2d(comm, "gloo")["value"]
    return out


def _names(seen: list) -> set[str]:
    return {entry[0] if isinstance(entry, (list, tuple)) else entry for entry in seen}


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "kind, size", [("hccl", 2), ("hccl", 4), ("cncl", 2), ("nccl", 2)], ids=lambda v: str(v)
)
def test_torch_programs_on_a_simulated_accelerator_as_on_gloo(kind, size):
    setup = simulated.setup(kind, devices=size)
    with World(size, backend=kind, setup=setup, timeout=300) as world:
        results = world.run(programs, kind, timeout=300)
    n = size * (size + 1) / 2
    for r in results:
        assert r["plugin"] == kind and r["all_reduce"] == [n, n]
        for name in ("ddp", "fsdp2"):
            weights, seen = r[name]
            diff = (torch.tensor(weights) - torch.tensor(r[name + "_gloo"])).abs().max()
            assert diff < 1e-6, (name, diff)
            assert seen, name  # through commlib: its recorder saw the collectives
        assert {"all_reduce", "broadcast"} <= _names(r["ddp"][1])
        assert {"all_gather_into_tensor", "reduce_scatter"} <= _names(r["fsdp2"][1])
        assert r["objects"] == r["objects_gloo"]
        if size == 4:
            assert r["mesh"]["whole"] and r["mesh"]["total"] == r["mesh_gloo"]["total"]
    assert all(r["ddp"][0] == results[0]["ddp"][0] for r in results)
