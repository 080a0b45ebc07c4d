"""Every rank of a fault raises a clear error, and every process then exits by itself, soon.

Each rank is a process of its own running ``tests/reliability/fault_rank.py`` as a
script, not a rank of a reusable world: what is measured is the process ending, through
the interpreter's own exit. The ranks are forked from one process that imported torch
once (:mod:`tests.reliability.preimported`), so none pays torch's import. The process
group's own timeout is 30 minutes, so a process can exit in time only because commlib
bounds the engine's wait by the communicator's timeout. Each rank prints when its error
was raised; the test records when its process ended. The seconds are printed
(``pytest -s``) for the reliability report; the bounds asserted are loose (the
2 shared cores of CI), the printed numbers are the measurement.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist

from tests.reliability.preimported import Preimported

# slow: each test starts its ranks as processes of their own and waits for them to exit; the
# limit lets a run's own deadline (START + 3 * TIMEOUT + EXIT_WITHIN) speak first
pytestmark = [pytest.mark.slow, pytest.mark.timeout(200)]

SCRIPT = Path(__file__).with_name("fault_rank.py")
ROOT = SCRIPT.parents[2]
TIMEOUT = 4.0  # the communicator's timeout in the ranks, seconds
EXIT_WITHIN = 20.0  # a process must end this soon after its error (the engine's slack is ~2 s)
START = 120.0  # seconds for the ranks to import torch and meet


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def launcher():
    """Rank processes forked from one that imported torch once (:mod:`preimported`)."""
    with Preimported() as server:
        yield server


def _run(launcher: Preimported, scenario: str, world: int) -> list[dict]:
    """Start ``world`` ranks of ``scenario``; each rank's records, exit code and end time."""
    store = None
    if scenario == "store_host_dies":
        port = _free_port()  # rank 0 holds the store, as env:// does
    else:
        store = tdist.TCPStore(
            "127.0.0.1",
            0,
            None,
            True,
            timeout=datetime.timedelta(seconds=60),
            wait_for_workers=False,
        )
        port = store.port
    with tempfile.TemporaryDirectory() as tmp:
        outputs = [(Path(tmp, f"{r}.out"), Path(tmp, f"{r}.err")) for r in range(world)]
        pids = [
            launcher.spawn(
                SCRIPT,
                [scenario, str(r), str(world), str(port), str(TIMEOUT)],
                dict(os.environ),
                ROOT,
                *outputs[r],
            )
            for r in range(world)
        ]
        deadline = time.monotonic() + START + 3 * TIMEOUT + EXIT_WITHIN
        ended = launcher.wait(pids, deadline)
        if len(ended) < world:
            launcher.kill(pids)  # a process that did not end is the failure
            killed = launcher.wait(pids, time.monotonic() + 30)
        else:
            killed = ended
        out = []
        for r, pid in enumerate(pids):
            stdout, stderr = (path.read_text() for path in outputs[r])
            records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
            out.append(
                {
                    "rank": r,
                    "records": records,
                    "errors": [x for x in records if "error_type" in x],
                    "returncode": killed.get(pid, (None, None))[0],
                    "ended_at": ended[pid][1] if pid in ended else None,
                    "stderr": stderr[-3000:],
                    # torch's C++ warnings: each call on a dead store logs one with its stack
                    "warnings": sum("[W" in line for line in stderr.splitlines()),
                    "stderr_lines": len(stderr.splitlines()),
                }
            )
    del store
    return out


def _exit_after(rank: dict) -> float:
    return rank["ended_at"] - rank["errors"][-1]["error_at"]


def _report(name: str, ranks: list[dict]) -> None:
    parts = []
    for r in ranks:
        if not r["errors"]:
            parts.append(f"rank {r['rank']}: rc {r['returncode']}")
            continue
        err = r["errors"][-1]
        parts.append(
            f"rank {r['rank']}: {err['error_type']} after {err['seconds']:.2f}s, "
            f"exited {_exit_after(r):.2f}s later (rc {r['returncode']})"
        )
    print(f"\n[exit] {name} world={len(ranks)}: " + "; ".join(parts))


# torch 2.13's gloo sometimes aborts a process in its C++ teardown, after Python
# has finished, when peers are still connected: seen here in the baseline too
# (no fault at all), about one run in ten to twenty. It happens after the error
# was raised and reported, so it is told apart from an abort during the run
# (gloo's EnforceNotMet on mismatched sizes, which is what the check prevents).
_EXIT_RACE = "terminate called without an active exception"


def _ended_by_itself(rank: dict) -> None:
    detail = f"rank {rank['rank']}: {rank}"
    assert rank["ended_at"] is not None, f"still running: {detail}"
    assert "EnforceNotMet" not in rank["stderr"], f"gloo aborted during the run: {detail}"
    exit_race = rank["returncode"] == -6 and rank["stderr"].rstrip().endswith(_EXIT_RACE)
    assert rank["returncode"] == 1 or exit_race, f"not a plain error exit: {detail}"
    if exit_race:
        print(f"\n[exit] rank {rank['rank']}: gloo's teardown abort at exit (see _EXIT_RACE)")
    assert _exit_after(rank) <= EXIT_WITHIN, detail


# Each scenario at an even and an odd size (2 and 3; stuck at 3 and 4, where the ranks
# are in three different calls): every process here is a fresh one, started for it
@pytest.mark.parametrize("world", [2, 3])
def test_baseline_exit_after_a_plain_error(launcher, world):
    # what any process takes here to exit after an error: the yardstick for the others
    ranks = _run(launcher, "baseline", world)
    _report("baseline", ranks)
    for r in ranks:
        _ended_by_itself(r)
        assert r["errors"][0]["error_type"] == "ValueError", r


@pytest.mark.parametrize("world", [2, 3])
def test_mismatched_arguments_raise_everywhere_and_nothing_aborts(launcher, world):
    ranks = _run(launcher, "mismatch", world)
    _report("mismatch", ranks)
    messages = set()
    for r in ranks:
        _ended_by_itself(r)
        (err,) = r["errors"]
        assert err["error_type"] == "RemoteArgumentError", r
        messages.add(err["message"])
    assert len(messages) == 1  # the same error on every rank, showing each rank's arguments
    (msg,) = messages
    assert f"rank {world - 1}: all_reduce(op=sum, torch.float32, (3000,))" in msg


@pytest.mark.parametrize("world", [3, 4])
def test_stuck_in_different_collectives_times_out_then_exits(launcher, world):
    ranks = _run(launcher, "stuck", world)
    _report("stuck", ranks)
    for r in ranks:
        _ended_by_itself(r)
        (err,) = r["errors"]
        assert err["error_type"] == "CommTimeoutError", r
        assert err["seconds"] < TIMEOUT + 8, r


@pytest.mark.parametrize("world", [2, 3])
def test_retry_after_a_timeout_raises_at_once_and_late_ranks_do_not_pair(launcher, world):
    ranks = _run(launcher, "retry", world)
    _report("retry", ranks)
    first, again = ranks[0]["errors"]
    assert (first["phase"], first["error_type"]) == ("first", "CommTimeoutError"), ranks[0]
    assert (again["phase"], again["error_type"]) == ("retry", "CommBrokenError"), ranks[0]
    assert again["seconds"] < 0.5, again  # at once: nothing was sent
    assert "comm.shrink()" in again["message"] and "restart" in again["message"]
    for r in ranks:
        _ended_by_itself(r)
    for r in ranks[1:]:
        (err,) = r["errors"]
        # the late call does not pair with the abandoned one: it learns of the failure
        assert err["phase"] == "late" and err["is_comm_error"], r
        assert err["seconds"] < TIMEOUT, r
        assert "gave up on it first" in err["message"] or "failed first" in err["message"], r


@pytest.mark.parametrize("world", [2, 3])
def test_a_killed_rank_lets_every_survivor_raise_and_exit(launcher, world):
    ranks = _run(launcher, "killed", world)
    _report("killed", ranks)
    victim = ranks[-1]
    assert victim["returncode"] == -9 and not victim["errors"], victim
    for r in ranks[:-1]:
        _ended_by_itself(r)
        (err,) = r["errors"]
        assert err["is_comm_error"], r
        assert err["seconds"] < TIMEOUT + 8, r
        # the dead rank by its rank, not by gloo's address of it (the last rank connected
        # to the others: they know its process ended, not its address)
        last = world - 1
        named = rf"lost the connection to rank {last}\b|rank {last} has exited"
        assert re.search(named, err["message"]), r


@pytest.mark.parametrize("world", [2, 3])
def test_a_killed_rank_0_is_named_too(launcher, world):
    ranks = _run(launcher, "killed_first", world)
    _report("killed-first", ranks)
    assert ranks[0]["returncode"] == -9 and not ranks[0]["errors"], ranks[0]
    for r in ranks[1:]:
        _ended_by_itself(r)
        (err,) = r["errors"]
        assert err["is_comm_error"], r
        # by the gloo address in the message where it is rank 0's listener (read in the
        # store), else by its process having ended: which side of a pair connects varies
        named = r"lost the connection to rank 0, which exited|rank 0 has exited"
        assert re.search(named, err["message"]), r


@pytest.mark.parametrize("world", [3])
def test_shrink_says_when_the_store_died_with_rank_0(launcher, world):
    ranks = _run(launcher, "store_host_dies", world)
    _report("store-host-dies", ranks)
    assert ranks[0]["returncode"] == -9
    for r in ranks[1:]:
        _ended_by_itself(r)
        err = r["errors"][-1]
        assert err["error_type"] == "CommError", r
        assert "store" in err["message"] and "restart" in err["message"], r
        # commlib stops asking a store that is gone: one warning, not one per look
        assert r["warnings"] <= 2 and r["stderr_lines"] < 60, (r["warnings"], r["stderr"])


@pytest.mark.parametrize(
    "scenario", ["held_then_destroyed", "held_at_exit", "future_pending_at_exit"]
)
def test_a_communicator_held_until_exit_lets_the_process_exit_cleanly(launcher, scenario):
    # a communicator the script still holds when it exits used to be the last
    # reference to its group, destroyed during C++ teardown: SIGABRT ("terminate
    # called without an active exception") in about half of the runs; commlib
    # now lets go of it at exit. On torch 2.12-2.14 these two scenarios no longer
    # abort even with that teardown switched off (12 runs of 2 ranks each, each torch,
    # eleventh session): what guards the teardown now is
    # test_exit_after_caught_error.py (a caught error's cycles hold the group; it
    # fails without the teardown). These stay as the behaviour a user relies on: a
    # held communicator, or a pending future, never turns a clean exit into an abort.
    # The three runs go at once: their ranks' waits (the group's start, the exit)
    # overlap, as on a busy machine, where the race was seen more often
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda _: _run(launcher, scenario, 2), range(3)))
    aborted = [r for ranks in runs for r in ranks if r["returncode"] != 0]
    if scenario == "future_pending_at_exit":
        # gloo's work still pending in its own thread when the process ends: on a loaded
        # machine (the suite's own 4-rank worlds) one run in several still aborts in torch's
        # teardown, on the session's starting tree too; a regression aborts most of them
        assert len(aborted) <= 1 and all(_EXIT_RACE in r["stderr"] for r in aborted), aborted
    else:
        assert not aborted, aborted
    for ranks in runs:
        for r in ranks:
            if r not in aborted:
                assert _EXIT_RACE not in r["stderr"], r
            assert r["records"][-1].get("finished"), r


def test_a_communicator_used_after_it_let_go_at_exit_says_so():
    from commlib import Communicator

    comm = Communicator()
    comm._release_at_exit()  # what the exit handler does to every communicator
    with pytest.raises(RuntimeError, match="interpreter is exiting"):
        comm.all_reduce(torch.ones(1))
