"""The conformance kit on the accelerator plugins, over simulated devices.

No GPU, NPU or MLU here: :mod:`commlib.testing.simulated` stands in for the
vendor package, its device runtime and its collective engine (gloo plays it);
the nccl / hccl / cncl plugins above run their real code. On the kit's own
ranks, each plugin's device selection and backend selection are checked too.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import commlib
from commlib import plugins
from commlib.testing import simulated
from commlib.testing.conformance import CHECKS, DEFAULT_WORLD_SIZES, Kit, KitPool

# slow: the whole kit per simulated plugin, on its own ranks
pytestmark = pytest.mark.slow

DEVICE_TYPE = {"nccl": "cuda", "hccl": "npu", "cncl": "mlu"}
VIA = {"nccl": "via torch.cuda", "hccl": "via torch.accelerator", "cncl": "via torch.accelerator"}
MULTI = "cpu:gloo,cuda:nccl"

# (kit backend, simulated accelerator, world sizes)
SIMULATED = [
    ("nccl", "nccl", DEFAULT_WORLD_SIZES),
    ("hccl", "hccl", DEFAULT_WORLD_SIZES),
    ("cncl", "cncl", DEFAULT_WORLD_SIZES),
    (MULTI, "nccl", (2,)),  # the multi-device form
]

_kits = KitPool()


def _kit(backend: str, kind: str) -> Kit:
    return _kits.get(backend, setup=simulated.setup(kind, devices=4))


@pytest.fixture(scope="module", autouse=True)
def _close_kits():
    yield
    _kits.close()


# -- extra checks on the kit's ranks ------------------------------------------------------
def _device_report(comm, kind: str) -> dict:
    """What a rank sees of its plugin, its device and backend selection."""
    from commlib.launch import default_torch_backend

    plugin = comm.plugin
    report = {
        "names": (comm.backend, dist.get_backend(), commlib.Communicator().backend),
        "index": plugin.accelerator_index(),
        "history": list(simulated.installed(kind).history),
        "runtime": repr(plugin.runtime()),
        "reason": plugin.unavailable_reason(),
        "default": default_torch_backend(),
        "by_device": plugins.resolve_backend(DEVICE_TYPE[kind]).name,
    }

    def refuse(*args, **kwargs):
        raise AssertionError("the vendor library was asked for something it lacks")

    # gather and scatter without a native one, and barrier, must not reach torch's versions
    saved = dist.gather, dist.scatter, dist.barrier
    dist.barrier = refuse
    if not plugin.native_gather:
        dist.gather = refuse
    if not plugin.native_scatter:
        dist.scatter = refuse
    try:
        got = comm.gather(torch.tensor([comm.rank]), dst=comm.world_size - 1)
        part = torch.zeros(1, dtype=torch.int64)
        parts = [torch.tensor([10 * r]) for r in range(comm.world_size)]
        comm.scatter(part, parts, src=comm.world_size - 1)
        comm.barrier()
    finally:
        dist.gather, dist.scatter, dist.barrier = saved
    report["gathered"] = [int(t) for t in got]
    report["scattered"] = int(part)
    return report


def _device_selection(kit: Kit, kind: str, size: int) -> None:
    for rank, rep in enumerate(kit.call(size, _device_report, kind)):
        assert rep["names"] == (kind, kind, kind)
        assert rep["index"] == rank and rep["history"] == [rank]  # from LOCAL_RANK
        assert VIA[kind] in rep["runtime"] and rep["reason"] is None
        assert rep["default"] == kind and rep["by_device"] == kind
        assert rep["gathered"] == (list(range(size)) if rank == size - 1 else [])
        assert rep["scattered"] == 10 * rank


def _placement(comm) -> dict:
    t = torch.ones(2)
    fresh = commlib.Communicator()
    return {
        "plugin": (comm.plugin.name, comm.plugin.torch_backend, str(comm.device)),
        "fresh": (fresh.plugin.name, fresh.plugin.torch_backend, commlib.get_backend()),
        "stays": comm.plugin.to_device(t) is t,
    }


def _multi_device_placement(kit: Kit, kind: str, size: int) -> None:
    for rep in kit.call(size, _placement):
        # tensors stay where they are (torch routes them); commlib's own traffic uses the CPU
        assert rep["plugin"] == ("nccl", MULTI, "cpu")
        assert rep["fresh"] == ("nccl", MULTI, MULTI) and rep["stays"]


EXTRAS = {"device_selection": _device_selection, "multi_device_placement": _multi_device_placement}

CASES = []
for _backend, _kind, _sizes in SIMULATED:
    for _size in _sizes:
        CASES += [(_backend, _kind, _size, n) for n, c in CHECKS.items() if c.applies(_size)]
    # on the ranks still running from the last size
    CASES.append(
        (
            _backend,
            _kind,
            _sizes[-1],
            "multi_device_placement" if ":" in _backend else "device_selection",
        )
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("backend", "kind", "size", "name"), CASES, ids=lambda v: str(v))
def test_simulated_accelerator_conforms(backend, kind, size, name):
    kit = _kit(backend, kind)
    if name in EXTRAS:
        EXTRAS[name](kit, kind, size)
        return
    result = kit.run(name, size)
    assert result.status == "passed", result.detail
