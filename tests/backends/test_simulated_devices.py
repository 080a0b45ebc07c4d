"""The accelerator plugins' own logic, over simulated devices.

Availability and reasons, device selection from LOCAL_RANK (and respect for a
device the user chose), torch.accelerator or the vendor module, backend
selection from a device or a multi-device spec, init_dist under torchrun, and
what each plugin supplies that its vendor library lacks.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import commlib
from commlib import plugins
from commlib.cli import main as cli_main
from commlib.testing import RankFailed, World, simulated
from tests.torch_build import nccl_reason

# slow: most tests start their own ranks, two under torchrun
pytestmark = pytest.mark.slow

DEVICE_TYPE = {"nccl": "cuda", "hccl": "npu", "cncl": "mlu"}
VIA = {"nccl": "torch.cuda", "hccl": "torch.accelerator", "cncl": "torch.accelerator"}


# -- in this process: no accelerator, no vendor package ---------------------------------
def test_info_lists_every_backend_with_its_reason(capsys):
    assert cli_main(["info"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[3:]}
    assert {"single", "gloo", "nccl", "hccl", "cncl"} <= set(rows)
    assert nccl_reason() in rows["nccl"]
    assert "torch_npu is not installed" in rows["hccl"]
    assert "torch_mlu is not installed" in rows["cncl"]
    infos = {b.name: b for b in commlib.list_backends()}
    for name, device in DEVICE_TYPE.items():
        assert infos[name].device_type == device and infos[name].torch_backend == name
        assert not infos[name].available


def test_what_each_vendor_library_lacks_is_declared():
    nccl, hccl, cncl = (plugins.resolve_backend(n) for n in ("nccl", "hccl", "cncl"))
    # bitwise ops: no vendor library has them
    for plugin in (nccl, hccl, cncl):
        assert not plugin.reduces_natively("band", torch.int64)
        assert plugin.reduces_natively("sum", torch.float32)
        assert not plugin.native_avg and plugin.large_payload_transport == "collective"
    assert nccl.reduces_natively("sum", torch.bool) and nccl.reduces_natively(
        "sum", torch.complex64
    )
    assert not nccl.reduces_natively("sum", torch.int16)
    # HCCL reduces neither uint8/bool nor float64
    assert not hccl.reduces_natively("sum", torch.bool)
    assert not hccl.reduces_natively("max", torch.uint8)
    assert not hccl.reduces_natively("sum", torch.float64)
    assert hccl.reduces_natively("product", torch.int32)
    # CNCL would send float64 as float32
    assert torch.float64 not in cncl.wire_dtypes and torch.float32 in cncl.wire_dtypes
    assert nccl.native_gather and not hccl.native_gather and not cncl.native_gather


def test_multi_device_spec_picks_the_accelerator_plugin():
    variant = plugins.backend_for_group("cpu:gloo,cuda:nccl")
    assert variant.name == "nccl" and variant.torch_backend == "cpu:gloo,cuda:nccl"
    assert variant.cpu_part == "gloo"
    assert plugins.resolve_backend("nccl").torch_backend == "nccl"  # the original is intact
    assert plugins.backend_for_group("gloo").name == "gloo"
    assert plugins.resolve_backend("cpu").name == "gloo"
    with pytest.raises(ValueError, match="unknown commlib backend 'nope': not a plugin"):
        plugins.resolve_backend("nope")


# -- in simulated ranks -------------------------------------------------------------------
def _device_state(comm, kind: str) -> tuple:
    return comm.plugin.accelerator_index(), list(simulated.installed(kind).history)


@pytest.mark.timeout(120)
def test_a_device_the_user_chose_is_kept():
    setup = simulated.setup("hccl", devices=4, current=3)
    with World(2, backend="hccl", setup=setup, timeout=60) as world:
        assert world.run(_device_state, "hccl") == [(3, []), (3, [])]


@pytest.mark.timeout(120)
def test_more_ranks_than_devices_share_them():
    with World(2, backend="cncl", setup=simulated.setup("cncl", devices=1), timeout=60) as world:
        assert world.run(_device_state, "cncl") == [(0, [0]), (0, [0])]


@pytest.mark.timeout(120)
def test_no_device_visible_is_a_clear_error():
    world = World(1, backend="hccl", setup=simulated.setup("hccl", devices=0), timeout=60)
    with pytest.raises(RankFailed, match="no NPU device visible"):
        world.start()
    world.kill()


def _torch_barrier(comm) -> str:
    import torch.distributed as dist

    dist.barrier()  # torch's own: it asks torch._C._get_accelerator() for its device
    return torch._C._get_accelerator().type


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["hccl", "cncl"])
def test_a_private_device_answers_torch_as_its_package_would(kind):
    # torch_npu / torch_mlu register the private device's hooks when imported
    with World(2, backend=kind, setup=simulated.setup(kind, devices=2), timeout=60) as world:
        assert world.run(_torch_barrier) == [DEVICE_TYPE[kind]] * 2


def _runtime(comm) -> tuple:
    return repr(comm.plugin.runtime()), list(simulated.installed("nccl").history)


@pytest.mark.timeout(120)
def test_nccl_through_torch_accelerator():
    setup = simulated.setup("nccl", devices=2, accelerator_api=True)
    with World(2, backend="nccl", setup=setup, timeout=60) as world:
        reports = world.run(_runtime)
    assert [h for _, h in reports] == [[0], [1]]
    assert all("via torch.accelerator" in r for r, _ in reports)


# -- init_dist under torchrun -------------------------------------------------------------
SCRIPT = textwrap.dedent(
    """
    import os, sys, torch
    from commlib.testing import simulated

    kind, backend = sys.argv[1], sys.argv[2] or None
    simulated.install(kind, devices=2)   # what importing the vendor package would do
    import commlib as dist

    dist.init_dist("pytorch", backend=backend)
    x = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(x)
    objs = dist.all_gather_object(dist.get_rank())
    with open(f"result_{dist.get_rank()}.txt", "w") as f:
        print(dist.get_communicator().backend, dist.get_backend(), x.item(), objs,
              simulated.installed(kind).history, file=f)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("kind", "backend", "expect"),
    [("hccl", "", "hccl hccl"), ("nccl", "cpu:gloo,cuda:nccl", "nccl cpu:gloo,cuda:nccl")],
    ids=["device-default", "multi-device"],
)
def test_init_dist_under_torchrun(tmp_path: Path, kind, backend, expect):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    # torchrun's log dirs go to the test's temporary directory, not the system's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            str(script),
            kind,
            backend,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [(tmp_path / f"result_{r}.txt").read_text().strip() for r in range(2)]
    assert lines == [f"{expect} 3.0 [0, 1] [{r}]" for r in range(2)]
