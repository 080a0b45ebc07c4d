"""A caught object-collective error must not turn into an abort at exit.

``broadcast_object_list([rank], src=rank)`` raises the same RemoteArgumentError
on every rank and the group goes on working; the process used to abort at
exit all the same ("terminate called without an active exception", exit -6)
in some runs: the object collective's handle keeps the error, the error's
traceback holds the handle's frames and the engine's, so that reference cycle
kept the engine's process group alive past commlib's teardown at exit, into
interpreter finalization, where a gloo worker thread still dropping its last
work needs the GIL of an interpreter that is going away. The teardown now
collects such garbage while Python still runs, and lets go of the traceback of
an uncaught error (printed already) that held the group the same way.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("caught_error_rank.py")
ABORT = "terminate called without an active exception"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp: Path, world: int, *args: str) -> subprocess.CompletedProcess[str]:
    tmp.mkdir(parents=True, exist_ok=True)
    # torchrun's log dirs and error files go to the test's temporary directory
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TMPDIR": str(tmp)}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(world),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        str(SCRIPT),
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=170, env=env)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "which, uncaught",
    [("broadcast", False), ("gather", False), ("broadcast", True)],
    ids=["broadcast", "gather", "uncaught"],
)
def test_the_teardown_at_exit_destroys_the_group_an_error_held(tmp_path, which, uncaught):
    # deterministic: the group's worker threads are gone once the teardown ran. Before,
    # both stayed: held by the caught error's reference cycle, or by the uncaught
    # error's traceback that Python keeps (sys.last_traceback) until finalization
    proc = _torchrun(tmp_path, 2, which, *(["uncaught"] if uncaught else []), "teardown")
    assert proc.returncode == (1 if uncaught else 0), proc.stderr[-3000:]
    assert ABORT not in proc.stderr
    assert proc.stdout.count("gloo workers left: 0") == 2, proc.stdout + proc.stderr[-3000:]


@pytest.mark.timeout(900)
def test_every_rank_exits_0_after_a_caught_object_collective_error(tmp_path):
    # the abort was a race (2 of 5 runs for a new user; 5 of 70 at 3 ranks here, under
    # load, 0 of 36 after the fix):
    # 4 runs at 2 ranks and 4 at 3, two at a time: the deterministic test above guards
    # the cause; these runs are the symptom a user saw (20 runs took 2 min of the suite)
    runs = [(2, "broadcast"), (3, "broadcast"), (2, "gather"), (3, "gather")] * 2
    with ThreadPoolExecutor(2) as pool:
        done = list(
            pool.map(
                lambda i: _torchrun(tmp_path / str(i), runs[i][0], runs[i][1]), range(len(runs))
            )
        )
    failed = [
        (runs[i], p.returncode, p.stderr[-2000:]) for i, p in enumerate(done) if p.returncode != 0
    ]
    assert not failed, failed
    for (world, _), p in zip(runs, done):
        assert p.stdout.count("finished") == world, p.stdout
        assert ABORT not in p.stderr
