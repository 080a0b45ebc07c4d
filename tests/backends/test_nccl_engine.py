"""Ready for torch 2.15's nccl2: the nccl plugin names its engine and binds its device at init.

Without a GPU (CI) the plugin's choice is checked against a recorded
``init_process_group``; with one (a lent GPU machine) the last test starts a
real world on nccl2 and checks the bound device, the engine's name and a
collective. docs/backends.md says what only that test can check.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from commlib import plugins
from commlib.testing import World
from commlib_backends import nccl as nccl_module
from commlib_backends import torch_build

HAS_NCCL2 = torch_build.NCCL_BUILT and hasattr(dist, "ProcessGroupNCCL2")


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(kw))
    return calls


def test_nccl2_world_is_bound_to_this_process_device(monkeypatch, recorded):
    plugin = plugins.resolve_backend("nccl")
    monkeypatch.setattr(nccl_module, "nccl_engine", lambda: "nccl2")
    monkeypatch.setattr(type(plugin), "accelerator_device", lambda self: torch.device("cuda", 1))
    plugin.init_process_group(init_method="env://")
    assert recorded == [
        {"init_method": "env://", "device_id": torch.device("cuda", 1), "backend": "nccl"}
    ]
    plugin.init_process_group(device_id=torch.device("cuda", 3))  # the user's choice stays
    assert recorded[1]["device_id"] == torch.device("cuda", 3)


def test_legacy_nccl_and_simulated_devices_bind_nothing(monkeypatch, recorded):
    plugin = plugins.resolve_backend("nccl")
    monkeypatch.setattr(type(plugin), "accelerator_device", lambda self: torch.device("cuda", 1))
    monkeypatch.setattr(nccl_module, "nccl_engine", lambda: "nccl")
    plugin.init_process_group()
    # a simulated device lives in host memory: nothing to bind even on nccl2
    monkeypatch.setattr(nccl_module, "nccl_engine", lambda: "nccl2")
    monkeypatch.setattr(type(plugin), "accelerator_device", lambda self: torch.device("cpu"))
    plugin.init_process_group()
    assert recorded == [{"backend": "nccl"}, {"backend": "nccl"}]


@pytest.mark.parametrize(("wanted", "engine"), [("1", "nccl2"), ("0", "nccl")])
def test_the_engine_follows_torch_dist_use_nccl2(monkeypatch, wanted, engine):
    monkeypatch.setenv("TORCH_DIST_USE_NCCL2", wanted)
    # torch without nccl2 (a CPU build, or before 2.14) has only the legacy engine
    assert torch_build.nccl_engine() == (engine if HAS_NCCL2 else "nccl")
    assert plugins.resolve_backend("nccl").engine() == torch_build.nccl_engine()


def _use_nccl2(rank: int, size: int) -> None:
    os.environ["TORCH_DIST_USE_NCCL2"] = "1"


def _on_gpu(comm) -> tuple:
    x = torch.ones(2, device=comm.device) * (comm.rank + 1)
    comm.all_reduce(x)
    bound = getattr(dist.group.WORLD, "bound_device_id", None)
    return comm.plugin.engine(comm.group), str(bound), x.tolist()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAS_NCCL2, reason="torch here has no nccl2 engine (torch >= 2.14, CUDA)")
@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a GPU: run on a lent GPU machine")
def test_nccl2_on_a_gpu_binds_the_device_and_names_itself():
    size = min(torch.cuda.device_count(), 2)
    with World(size, backend="nccl", setup=_use_nccl2, timeout=120) as world:
        results = world.run(_on_gpu)
    total = float(sum(range(1, size + 1)))
    assert results == [("nccl2", f"cuda:{r}", [total, total]) for r in range(size)]
