"""torch's DDP tutorial (examples/ddp_tutorial.py, its backend "commlib") as a user runs it:
under torchrun on gloo, under mpiexec on mpi; its collectives in ``COMMLIB_STATS`` and
``commlib trace``. And ``commlib.init_dist(serve_torch=True)``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from commlib import cli
from tests.torch_programs.mpi_kit import mpi_kit

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "ddp_tutorial.py"
LAUNCH = Path(__file__).with_name("launch_script.py")


def _torchrun(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        *args,
    ]


def _mpiexec(*args: str) -> list[str]:
    import commlib

    mpi_kit()  # skips where mpi cannot run
    return [*commlib.plugins.resolve_backend("mpi").launch_command(2), sys.executable, *args]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", ["torchrun", "mpiexec"])
def test_the_tutorial_runs_on_commlib_and_its_collectives_are_recorded(launcher, tmp_path, capsys):
    stats, trace = tmp_path / "stats", tmp_path / "trace"
    env = dict(
        os.environ, COMMLIB_STATS=str(stats), COMMLIB_TRACE_DIR=str(trace), OMP_NUM_THREADS="1"
    )
    if launcher == "torchrun":
        command = _torchrun(str(LAUNCH), str(SCRIPT))
    else:
        command = _mpiexec(str(LAUNCH), str(SCRIPT))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in (0, 1):
        assert f"Finished running basic DDP example on rank {rank}." in done.stdout
    engine = "gloo" if launcher == "torchrun" else "mpi4py"  # the torch engine under the plugin
    for rank in (0, 1):
        ops = json.loads((stats / f"commlib_stats_rank{rank}.json").read_text())
        text = json.dumps(ops)
        # DDP's start (broadcast) and its gradient bucket (all_reduce), through commlib
        assert '"all_reduce"' in text and '"broadcast"' in text, text[:2000]
    assert cli.main(["trace", str(trace)]) in (0, None)
    out = capsys.readouterr().out
    assert f"/{engine} (ranks 0, 1)" in out, out
    # the gradient bucket, at the tutorial's backward line
    backward = next(
        i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if ".backward()" in line
    )
    assert "all_reduce #" in out and f"ddp_tutorial.py:{backward} (demo_basic)" in out, out


@pytest.mark.timeout(300)
def test_init_dist_serve_torch_makes_the_world_a_commlib_group():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = _torchrun(str(Path(__file__).with_name("serve_torch_script.py")))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rank 0: served, guard" in done.stdout and "rank 1: served, guard" in done.stdout
