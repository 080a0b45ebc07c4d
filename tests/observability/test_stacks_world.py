"""Where each rank is, at worlds 2 and 4 on gloo: call sites in the verdict, every rank's stacks.

One world of 2 serves two cases in order: a live job asked for its stacks
with ``commlib stacks`` (it goes on), then a rank stuck in a Python loop of its
own while the other times out waiting for it. One world of 4 has a rank in a
loop and a rank killed while the others wait. ``commlib trace`` names every
rank's call site, and the stacks show the stuck rank's function.
"""

from __future__ import annotations

import functools
import io
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from commlib import Communicator
from commlib.cli import main as cli
from commlib.cli import stacks as stacks_command
from commlib.errors import CommError
from commlib.observe import diagnosis, stats_report, trace_files
from commlib.testing import RankDied, World

TIMEOUT = 2.0


def _trace_into(directory: str, rank: int, size: int) -> None:
    os.environ["COMMLIB_TRACE_DIR"] = directory


def _at(marker: str) -> str:
    """``test_stacks_world.py:LINE (function)`` of the line marked ``# marker``."""
    lines = Path(__file__).read_text().splitlines()
    (number,) = [i for i, line in enumerate(lines, 1) if line.endswith(f"# {marker}")]
    function = next(
        line.split("def ")[1].split("(")[0]
        for line in reversed(lines[:number])
        if line.startswith("def ")
    )
    return f"{Path(__file__).name}:{number} ({function})"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    directory = tmp_path_factory.mktemp("trace2")
    world = World(
        2, timeout=90, pg_timeout=30, setup=functools.partial(_trace_into, str(directory))
    )
    world.start()
    yield world, directory
    world.kill()


def _stacks_taken(directory: str, rank: int, since: float = 0.0) -> bool:
    """Whether ``rank``'s file holds stacks taken after ``since`` (``time.time()``)."""
    try:
        snapshots, _ = trace_files.read_all(directory)
    except OSError:
        return False
    return any(
        s["rank"] == rank and s.get("stacks") and s["stacks"]["taken"] >= since for s in snapshots
    )


def _nap_until_asked(directory: str) -> None:
    """The program's own wait: it sleeps until its stacks were taken (at most 30 s)."""
    end, since = time.monotonic() + 30, time.time()
    while time.monotonic() < end and not _stacks_taken(directory, 1, since):
        time.sleep(0.05)  # napping


def _live_job(comm, directory):
    c = Communicator(timeout=60)
    c.all_reduce(torch.ones(1))  # every rank knows its rank: its pid is in the directory
    if c.rank == 1:
        _nap_until_asked(directory)
    c.all_reduce(torch.ones(1))  # rank 0 waits here
    return "went on"


def test_commlib_stacks_asks_a_live_job_and_it_goes_on(pair):
    world, directory = pair
    result: list = []
    runner = threading.Thread(target=lambda: result.append(world.run(_live_job, str(directory))))
    runner.start()
    end = time.monotonic() + 30
    while time.monotonic() < end and len(trace_files.read_live(directory)) < 2:
        time.sleep(0.05)
    out = io.StringIO()
    code = stacks_command(str(directory), timeout=20, out=out)
    runner.join(60)
    text = out.getvalue()
    assert code == 0, text
    assert result == [["went on", "went on"]]  # the job was not stopped
    assert text.startswith("asked rank 0 (pid ")
    # the roll-call: rank 0 in the collective, rank 1 in its own wait
    assert "rank 0: MainThread" in text and "rank 1: MainThread" in text
    assert "in _nap_until_asked" in text and "in _live_job" in text
    # where each main thread is: its innermost frame of the program's
    assert f"now in {_at('rank 0 waits here')}\n" in text
    assert f"now in {_at('napping')} (not in a collective)" in text


def _mixed_sizes(comm, directory):
    """Collectives of mixed sizes with statistics on; each rank writes its own file."""
    from commlib.observe import CollectiveStats
    from commlib.plugins import plugin_manager

    stats = CollectiveStats()
    plugin_manager().register(stats)
    try:
        c = Communicator(timeout=60)
        for i in range(60):
            c.all_reduce(torch.ones(1 << (2 * (i % 4) + 2)))  # 16 B to 1 KiB
            c.broadcast(torch.ones(1 << 12), src=i % 2)
            if c.rank == 1:
                time.sleep(0.001)  # rank 1 comes late to each all_gather
            c.all_gather(torch.ones(256))
    finally:
        plugin_manager().unregister(stats)
    out = io.StringIO()
    stats.report(directory, stream=out)  # the last rank to write prints every rank's view
    return out.getvalue()


def test_statistics_by_op_and_size_with_the_straggler_view(pair, tmp_path, capsys):
    world, _ = pair
    printed = world.run(_mixed_sizes, str(tmp_path))
    (view,) = [p for p in printed if p]  # printed once, by whichever wrote last
    assert cli(["stats", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == view.strip()
    assert "by op and size, every rank" in view
    merged = stats_report.merge(tmp_path)
    rows = {(r["name"], r["bucket"]): r for r in merged["sizes"]}
    assert sorted(rows) == [
        ("all_gather", 2048),  # 2 ranks x 1 KiB gathered
        ("all_reduce", 16),
        ("all_reduce", 64),
        ("all_reduce", 256),
        ("all_reduce", 1024),
        ("broadcast", 16384),
    ]
    assert rows[("all_reduce", 16)]["calls"] == 15 and rows[("broadcast", 16384)]["calls"] == 60
    assert all(stats_report.bandwidths(r)[1] is not None for r in rows.values())
    (straggle,) = merged["stragglers"]
    assert straggle["collectives"] == 180
    # rank 1 sleeps before each all_gather: it is last at least at those
    assert straggle["per_rank"]["1"]["last"] >= 60
    assert "stragglers, group" in view and "last to arrive" in view


def _finite_checks(comm):
    """NaN on one rank, on every rank, with the argument check and without it."""
    from commlib.errors import NonFiniteError

    seen = []
    for strict in (None, False):  # the check's round (gloo's default), and a round of its own
        c = Communicator(timeout=60, strict=strict, check_finite=True)
        for bad in ({1}, {0, 1}, set()):
            x = torch.tensor([float("nan") if c.rank in bad else 1.0, 2.0])
            try:
                c.all_reduce(x)  # the reduction
                seen.append(x.tolist())
            except NonFiniteError as exc:
                seen.append((exc.ranks, str(exc)))
    return seen


def test_a_nan_is_refused_on_every_rank_before_it_spreads(pair):
    world, _ = pair
    first, second = world.run(_finite_checks)
    assert first == second  # every rank raised the same error
    where = _at("the reduction")
    for one, both, none in (first[:3], first[3:]):
        assert one == (
            [1],
            f"all_reduce at {where}: rank 1 passes NaN or Inf; nothing was reduced",
        )
        assert both[0] == [0, 1] and "ranks 0, 1 pass NaN or Inf" in both[1]
        assert none == [2.0, 4.0]


def _busy(seconds_at_most: float, directory: str) -> int:
    """A loop of the program's own that never reaches the collective in time.

    A thread of its own watches for the stacks to be taken, so that the main
    thread is in this loop, and nowhere else, whenever they are.
    """
    taken, since = threading.Event(), time.time()

    def watch() -> None:
        end = time.monotonic() + seconds_at_most
        while time.monotonic() < end and not _stacks_taken(directory, 1, since):
            time.sleep(0.05)
        taken.set()

    threading.Thread(target=watch, daemon=True).start()
    spins = 0
    while not taken.is_set():  # stuck here
        spins += 1  # stuck here too
    return spins


def _stuck_in_a_loop(comm, directory):
    c = Communicator(timeout=TIMEOUT)
    c.all_gather_object({"rank": c.rank})  # before the loop
    if c.rank == 1:
        _busy(30, directory)
        time.sleep(1)  # its file is written; the other has given up
        return "looped"
    c.all_reduce(torch.ones(4))  # rank 0 waits for rank 1


def test_a_rank_stuck_in_a_python_loop_is_named_with_its_function(pair, capsys):
    world, directory = pair
    outcomes = world.outcomes(_stuck_in_a_loop, str(directory))
    assert isinstance(outcomes[0].error, CommError) and outcomes[1].value == "looped"
    found = diagnosis.diagnose(directory)
    # the first case's communicator agreed on everything; this one did not
    (group,) = [g for g in found["groups"] if g["first_disagreement"] is not None]
    seq = group["first_disagreement"]
    # the loop's two lines: its test and its body
    assert group["verdict"] in [
        [
            f"rank 0 wait in all_reduce #{seq} at {_at('rank 0 waits for rank 1')}; rank 1 "
            f"never arrived (last: all_gather_object #{seq - 1} at {_at('before the loop')}, "
            f"completed); rank 1 is in {_at(line)}, not in a collective"
        ]
        for line in ("stuck here", "stuck here too")
    ]
    # rank 1's stacks were taken when rank 0's timeout asked for them
    assert found["stacks"]["1"]["reason"].startswith("asked by rank 0: all_reduce")
    assert cli(["trace", str(directory), "--stacks"]) == 0
    text = capsys.readouterr().out
    stacks = text[text.index("stacks (innermost frame last)") :]
    assert "rank 1: MainThread" in stacks and "in _busy" in stacks
    assert "# stuck here" in stacks
    # rank 0's stack, taken as its collective timed out, is inside commlib, from its call
    assert "rank 0: MainThread" in stacks and "# rank 0 waits for rank 1\n" in stacks
    assert "... inside commlib" in stacks


# -- four ranks: one in a loop, one killed, two waiting --------------------------------
def _four(comm, directory):
    c = Communicator(timeout=TIMEOUT)
    c.all_gather_object({"rank": c.rank})  # all four
    if c.rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    if c.rank == 1:
        _busy(30, directory)
        time.sleep(1)
        return "looped"
    c.all_reduce(torch.ones(4))  # ranks 0 and 2


@pytest.mark.slow  # a world of its own: the killed rank ends it
def test_four_ranks_one_in_a_loop_one_killed(tmp_path):
    with World(
        4, timeout=90, pg_timeout=30, setup=functools.partial(_trace_into, str(tmp_path))
    ) as world:
        outcomes = world.outcomes(_four, str(tmp_path))
    assert isinstance(outcomes[3].error, RankDied) and outcomes[1].value == "looped"
    found = diagnosis.diagnose(tmp_path)
    seq = found["groups"][0]["first_disagreement"]
    assert found["missing_files"] == [3]
    verdict = "\n".join(found["verdict"])
    # ranks 0 and 2 failed in it as rank 3's connections closed: they "called" it
    assert f"ranks 0, 2 called all_reduce #{seq} at {_at('ranks 0 and 2')}" in verdict
    assert any(
        f"rank 1 is in {_at(line)}, not in a collective" in verdict
        for line in ("stuck here", "stuck here too")
    )
    assert "rank 3 left no trace file" in verdict
