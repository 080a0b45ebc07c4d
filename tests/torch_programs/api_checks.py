"""What the ranks run for tests/torch_programs/test_torch_apis.py: FSDP2, DeviceMesh and
DTensor, torch.distributed.checkpoint and torch's object collectives, each on groups of a
torch backend (``"gloo"``: the reference; ``"commlib-gloo"``, ``"commlib-mpi"``).

Each returns what it computed and the collectives commlib's flight recorder saw
(nothing on plain gloo).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from commlib.observe import disable_flight_recorder, enable_flight_recorder
from tests.torch_programs.ddp_checks import group_of, model

_meshes: dict[tuple[str, tuple[int, ...]], Any] = {}


def _mesh(backend: str, shape: tuple[int, ...]) -> Any:
    """This rank's device mesh of ``shape`` over groups of ``backend`` (made on first use)."""
    mesh = _meshes.get((backend, shape))
    if mesh is None:
        override = dict.fromkeys(range(len(shape)), backend)
        names = ("dp", "tp")[: len(shape)]
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names, backend_override=override)
        _meshes[backend, shape] = mesh
    return mesh


def _recorded(fn: Callable[[], Any]) -> dict[str, Any]:
    recorder = enable_flight_recorder()
    # the recorder keeps what this rank's earlier tests recorded: only this run's entries count
    earlier = {(e["group"], e["seq"]) for e in recorder.snapshot()["entries"]}
    try:
        value = fn()
        entries = recorder.snapshot()["entries"]
        seen = sorted({e["name"] for e in entries if (e["group"], e["seq"]) not in earlier})
    finally:
        disable_flight_recorder()
    return {"value": value, "seen": seen}


def fsdp2(comm: Any, backend: str) -> dict[str, Any]:
    """Three steps of FSDP2 (``fully_shard`` per layer and the whole) on a 1-D mesh."""
    mesh = _mesh(backend, (dist.get_world_size(),))
    rank = dist.get_rank()

    def train() -> list[float]:
        torch.manual_seed(0)  # FSDP2 shards the same initial weights
        net = model()
        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for step in range(3):
            torch.manual_seed(100 * step + rank)
            net(torch.randn(16, 8)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        full = [p.full_tensor().detach().reshape(-1) for p in net.parameters()]
        return torch.cat(full).tolist()

    return _recorded(train)


def mesh_2d(comm: Any, backend: str) -> dict[str, Any]:
    """A 2 x (size/2) mesh; a DTensor sharded, redistributed and gathered back."""
    mesh = _mesh(backend, (2, dist.get_world_size() // 2))

    def redistribute() -> dict[str, Any]:
        torch.manual_seed(0)
        full = torch.randn(8, 6)
        rows = distribute_tensor(full, mesh, [Shard(0), Replicate()])
        cols = rows.redistribute(mesh, [Replicate(), Shard(1)])
        both = cols.redistribute(mesh, [Shard(0), Shard(1)])
        total = (both * 2).sum().full_tensor()
        return {
            "rows": rows.to_local().tolist(),
            "cols": cols.to_local().tolist(),
            "both": both.to_local().tolist(),
            "whole": torch.equal(both.full_tensor(), full),
            "total": float(total),
            "groups": sorted({type(mesh.get_group(d)).__name__ for d in range(2)}),
        }

    return _recorded(redistribute)


def checkpoint(comm: Any, backend: str, directory: str) -> dict[str, Any]:
    """torch.distributed.checkpoint: save a model and a step, load them into another."""
    group = group_of(backend)

    def save_and_load() -> dict[str, Any]:
        torch.manual_seed(0)
        saved = model()
        dcp.save({"model": saved.state_dict(), "step": 7}, checkpoint_id=directory,
                 process_group=group)  # fmt: skip
        loaded = model()
        for p in loaded.parameters():
            nn.init.zeros_(p)
        state = {"model": loaded.state_dict(), "step": 0}
        dcp.load(state, checkpoint_id=directory, process_group=group)
        same = all(torch.equal(a, b) for a, b in zip(saved.parameters(), loaded.parameters()))
        return {"same": same, "step": state["step"]}

    return _recorded(save_and_load)


def object_collectives(comm: Any, backend: str) -> dict[str, Any]:
    """torch's own object collectives (pickled objects in tensors) on the group."""
    group = group_of(backend)
    rank, size = dist.get_rank(), dist.get_world_size()

    def exchange() -> dict[str, Any]:
        everyone: list[Any] = [None] * size
        dist.all_gather_object(everyone, {"rank": rank, "data": list(range(rank))}, group=group)
        sent = [{"from": 0, "big": "x" * 5000}] if rank == 0 else [None]
        dist.broadcast_object_list(sent, src=0, group=group)
        gathered: list[Any] | None = [None] * size if rank == 0 else None
        dist.gather_object(("r", rank), gathered, dst=0, group=group)
        mine: list[Any] = [None]
        parts = [{"part": i} for i in range(size)] if rank == 0 else None
        dist.scatter_object_list(mine, parts, src=0, group=group)
        received: list[Any] = [None]
        if rank == 0:
            dist.send_object_list([{"to": size - 1}], dst=size - 1, group=group)
        elif rank == size - 1:
            dist.recv_object_list(received, src=0, group=group)
        return {
            "everyone": everyone,
            "sent": sent[0]["big"][:3] + str(len(sent[0]["big"])),
            "gathered": gathered,
            "mine": mine,
            "received": received,
        }

    return _recorded(exchange)
