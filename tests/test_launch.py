"""init_dist under a real torchrun, and its argument checks."""

from __future__ import annotations

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

    dist.init_dist("pytorch")
    x = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(x, "mean")
    objs = dist.all_gather_object({"local": dist.get_local_rank()})
    with open(f"result_{dist.get_rank()}.txt", "w") as f:
        print("RESULT", dist.get_rank(), dist.get_world_size(), dist.get_local_size(),
              dist.get_backend(), x.item(), objs, file=f)
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
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [(tmp_path / f"result_{r}.txt").read_text().strip() for r in range(3)]
    expect_objs = str([{"local": r} for r in range(3)])
    assert lines == [f"RESULT {r} 3 3 gloo 2.0 {expect_objs}" for r in range(3)]


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
