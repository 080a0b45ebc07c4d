"""``commlib run``'s exit code says whether the job failed, and it leaves no temporary folder.

A rank that fails and that nobody went on without fails the job (non-zero),
however the others ended; a rank the survivors shrank away (the docs'
recovery loop) does not (0). Without ``--log-dir`` no ``commlib_run_*``
folder is left in the temporary directory.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from commlib import cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

UNCAUGHT = """
import time, torch, commlib
commlib.init_dist(backend="gloo")
comm = commlib.get_communicator()
comm.all_reduce(torch.ones(1))
if comm.rank == 1:
    raise ValueError("a bug on rank 1")
time.sleep(1.0)  # rank 0 ends last, and well
"""

SHRUNK = """
import os, signal, torch, commlib
commlib.init_dist(backend="gloo")
comm = commlib.get_communicator()
comm.all_reduce(torch.ones(1))
step = 0
while step < 4:
    if step == 2 and comm.world_size == 3 and comm.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_reduce(torch.ones(1))
    except (commlib.RankLostError, commlib.CommTimeoutError):
        comm = comm.shrink()
        continue
    step += 1
assert comm.world_size == 2
"""


def _run(tmp_path: Path, monkeypatch, script: str, world: int) -> int:
    path = tmp_path / "job.py"
    path.write_text(script)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        code = cli.main(["run", "--nproc-per-node", str(world), str(path)])
    finally:  # torch's process contexts turn these signals into exceptions in the launcher
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert list(temp.glob("commlib_run_*")) == []  # nothing kept unless asked (--log-dir)
    return code


def test_an_uncaught_error_on_one_rank_fails_the_job_though_the_last_ended_well(
    tmp_path, monkeypatch, capfd
):
    assert _run(tmp_path, monkeypatch, UNCAUGHT, 2) == 1
    assert "rank 1 (pid" in capfd.readouterr().err


def test_a_rank_the_survivors_shrank_away_does_not_fail_the_job(tmp_path, monkeypatch, capfd):
    assert _run(tmp_path, monkeypatch, SHRUNK, 3) == 0
    err = capfd.readouterr().err
    assert "rank 2 (pid" in err and "SIGKILL" in err, err[-3000:]
