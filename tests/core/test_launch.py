"""init_dist under a real torchrun, and its argument checks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

import commlib

SCRIPT = textwrap.dedent(
    """
    import torch
    import commlib as dist
    from commlib_backends.gloo import GlooBackend

    class MyGloo(GlooBackend):  # a user's own plugin, passed to init_dist
        name = "my-gloo"

    dist.init_dist("pytorch", backend=MyGloo())
    x = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(x, "mean")
    objs = dist.all_gather_object({"local": dist.get_local_rank()})
    # a communicator made later is served by the plugin init_dist started the world with
    served = dist.Communicator().backend
    with open(f"result_{dist.get_rank()}.txt", "w") as f:
        print("RESULT", dist.get_rank(), dist.get_world_size(), dist.get_local_size(),
              dist.get_backend(), x.item(), objs, served, file=f)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_init_dist_under_torchrun(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "3",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # torchrun's log dirs, in the test's
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [(tmp_path / f"result_{r}.txt").read_text().strip() for r in range(3)]
    expect_objs = str([{"local": r} for r in range(3)])
    assert lines == [f"RESULT {r} 3 3 gloo 2.0 {expect_objs} my-gloo" for r in range(3)]


def test_init_dist_arguments(monkeypatch):
    with pytest.raises(ValueError, match="launcher"):
        commlib.init_dist("k8s")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="RANK"):
        commlib.init_dist("pytorch")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        commlib.init_dist("pytorch")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    with pytest.raises(ValueError, match="without a process group"):
        commlib.init_dist("pytorch", backend="single")


def test_a_script_started_by_hand_is_told_how_to_start_it(monkeypatch):
    # `python train.py` with init_dist("mpi") or ("pytorch"): the launcher is missing
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r"mpiexec -n N python SCRIPT"):
        commlib.init_dist("mpi", backend="gloo")
    with pytest.raises(ValueError, match=r"RANK and WORLD_SIZE are not set: start .* torchrun"):
        commlib.init_dist("pytorch")


# what init_dist writes into the environment
_WRITTEN = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.mark.parametrize(
    ("launcher", "env", "kwargs", "addr", "port"),
    [
        ("slurm", {"MASTER_ADDR": "10.0.0.9"}, {"port": 12345}, "10.0.0.9", "12345"),
        ("slurm", {"MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "777"}, {}, "10.0.0.9", "777"),
        ("slurm", {"SLURM_NODELIST": "node[3-4]"}, {}, "node3", "29500"),
        ("mpi", {"MASTER_ADDR": "10.0.0.9"}, {}, "10.0.0.9", "29500"),
    ],
)
def test_init_dist_slurm_and_mpi_addresses_as_mmengine(
    monkeypatch, tmp_path, launcher, env, kwargs, addr, port
):
    for name in (*_WRITTEN, "SLURM_NODELIST"):
        monkeypatch.setenv(name, "")  # so that the delenv, and what init_dist writes, is undone
        monkeypatch.delenv(name)
    for name, value in {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "1",
        **env,
    }.items():
        monkeypatch.setenv(name, value)
    scontrol = tmp_path / "scontrol"  # slurm's: one host per line
    scontrol.write_text('#!/bin/sh\n[ "$3" = "node[3-4]" ] && printf "node3\\nnode4\\n"\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    # the addresses are settled before the backend is: "single" stops it there
    with pytest.raises(ValueError, match="without a process group"):
        commlib.init_dist(launcher, backend="single", **kwargs)
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == (addr, port)


def test_init_dist_port_is_slurms(monkeypatch):
    for name in _WRITTEN:
        monkeypatch.setenv(name, "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(TypeError, match="slurm"):
        commlib.init_dist("pytorch", port=1234)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        commlib.init_dist("slurm")
