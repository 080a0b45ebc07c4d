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

import datetime
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch.distributed as tdist

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("caught_error_rank.py")
ABORT = "terminate called without an active exception"


@dataclass
class Ranks:
    """How the ranks of one run ended: each one's exit code, their output together."""

    returncodes: list[int]
    stdout: str
    stderr: str


def _launch(tmp: Path, world: int, *args: str) -> Ranks:
    """``world`` ranks of the script, as torchrun starts its workers, without the agent.

    The ranks get torchrun's variables and, like its workers, find the store in
    another process that outlives them (this one, in the agent's place): so
    ``init_dist("pytorch")`` and commlib's teardown at exit run as under torchrun,
    and no torchrun agent is started and stopped for each run.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    store = tdist.TCPStore(
        "127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False
    )
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TMPDIR": str(tmp)}
    base.update(
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store.port),
        TORCHELASTIC_USE_AGENT_STORE="True",  # the store is the agent's: ranks are clients
        OMP_NUM_THREADS="1",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
        )
        for r in range(world)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=170))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()  # ours, by pid: a rank that did not end is the failure
                p.wait()
    del store
    return Ranks(
        [p.returncode for p in procs], "".join(o for o, _ in outs), "".join(e for _, e in outs)
    )


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
    ranks = _launch(tmp_path, 2, which, *(["uncaught"] if uncaught else []), "teardown")
    assert ranks.returncodes == [1 if uncaught else 0] * 2, ranks.stderr[-3000:]
    assert ABORT not in ranks.stderr
    assert ranks.stdout.count("gloo workers left: 0") == 2, ranks.stdout + ranks.stderr[-3000:]


@pytest.mark.timeout(300)
def test_every_rank_exits_0_after_a_caught_object_collective_error(tmp_path):
    # the abort was a race (2 of 5 runs for a new user; 5 of 70 at 3 ranks here, under
    # load, 0 of 36 after the fix):
    # 4 runs at 2 ranks and 4 at 3, two at a time: the deterministic test above guards
    # the cause; these runs are the symptom a user saw (under torchrun, whose agent
    # only adds a process per run here: see _launch)
    runs = [(2, "broadcast"), (3, "broadcast"), (2, "gather"), (3, "gather")] * 2
    with ThreadPoolExecutor(2) as pool:
        done = list(
            pool.map(
                lambda i: _launch(tmp_path / str(i), runs[i][0], runs[i][1]), range(len(runs))
            )
        )
    failed = [
        (runs[i], r.returncodes, r.stderr[-2000:])
        for i, r in enumerate(done)
        if any(r.returncodes)
    ]
    assert not failed, failed
    for (world, _), r in zip(runs, done):
        assert r.stdout.count("finished") == world, r.stdout
        assert ABORT not in r.stderr
