"""The slot rounds through shared memory (commlib._shared_rows): the segment, then real ranks.

The segment's own tests put two "ranks" of one segment in this process. The
multi-rank ones run on gloo: a group made by new_group shares its rounds at
once; one rank that turns it off keeps every rank on the engine; a rank that
stays away makes the others time out; a rank whose process ends is named.
"""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from commlib import Communicator, _shared_rows, _survivors
from commlib._shared_rows import SharedRows
from commlib.errors import CommError, CommTimeoutError
from commlib.testing import RankDied, World


def _pair(world: int = 2) -> list[SharedRows]:
    size = _shared_rows._data_at(world) + 2 * world * _shared_rows._area_for(world)
    buffer = mmap.mmap(-1, size)
    return [SharedRows(buffer, world, r, [None] * world) for r in range(world)]


def _row(value: int, size: int = 64) -> torch.Tensor:
    return torch.full((size,), value, dtype=torch.uint8)


def test_every_rank_gets_every_row_in_rank_order():
    ranks = _pair(3)
    outs = [torch.zeros(3 * 64, dtype=torch.uint8) for _ in ranks]
    works = [r.lane(64, False).call(outs[i], _row(10 + i), None) for i, r in enumerate(ranks)]
    for work in works:
        assert work.wait() and work.is_completed()
    for out in outs:
        assert out.view(3, 64)[:, 0].tolist() == [10, 11, 12]


def test_rows_apart_reach_their_rank_and_generations_take_turns():
    a, b = _pair(2)
    for round_ in range(5):  # two generations, in turn: a later round never sees an earlier
        outs = [torch.zeros(2 * 32, dtype=torch.uint8) for _ in range(2)]
        # rank i's row j is 100 * round + 10 * i + j
        sent = [
            torch.stack([_row(100 * round_ % 200 + 10 * i + j, 32) for j in range(2)])
            for i in range(2)
        ]
        works = [
            r.lane(32, True).call(outs[i], sent[i], [], [], None) for i, r in enumerate((a, b))
        ]
        for w in works:
            w.wait()
        for j, out in enumerate(outs):  # rank j gets row j of every rank
            assert out.view(2, 32)[:, 0].tolist() == [
                100 * round_ % 200 + 10 * i + j for i in range(2)
            ]


def test_a_rank_in_another_protocols_round_is_seen_as_the_engine_would_show_it():
    # rank 0 sends one row for all (an object round), rank 1 its rows apart (a check):
    # each gets what the engine would have delivered from the other
    a, b = _pair(2)
    out_a, out_b = torch.zeros(64, dtype=torch.uint8), torch.zeros(64, dtype=torch.uint8)
    wa = a.lane(32, False).call(out_a, _row(7, 32), None)
    wb = b.lane(32, True).call(out_b, torch.stack([_row(20, 32), _row(21, 32)]), [], [], None)
    wa.wait()
    wb.wait()
    assert out_a.view(2, 32)[:, 0].tolist() == [7, 20]  # b's row for rank 0
    assert out_b.view(2, 32)[:, 0].tolist() == [7, 21]  # a's one row; b's own row 1


def test_rows_larger_than_an_area_take_the_engine():
    a, _ = _pair(2)
    assert a.lane(a.area, False) is not None
    assert a.lane(a.area + 16, False) is None
    assert a.lane(a.area // 2 + 16, True) is None  # two rows apart


def test_a_wait_times_out_naming_the_ranks_missing():
    a, _ = _pair(2)
    work = a.lane(16, False).call(torch.zeros(32, dtype=torch.uint8), _row(1, 16), None)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"Operation timed out.*ranks \[1\]"):
        work.wait(_seconds(0.2))
    assert time.monotonic() - start < 5
    assert not work.is_completed()


def test_a_peer_whose_process_ended_is_named():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record = _survivors.process_record()
    if record is None:
        pytest.skip("no process records on this platform")
    a, _ = _pair(2)
    a.records = [record, record.rpartition(" ")[0] + f" {gone.pid}"]
    work = a.lane(16, False).call(torch.zeros(32, dtype=torch.uint8), _row(1, 16), None)
    with pytest.raises(RuntimeError, match="rank 1 ended its process"):
        work.wait(_seconds(10))


def _seconds(s: float):
    import datetime

    return datetime.timedelta(seconds=s)


# -- real ranks --------------------------------------------------------------------------
def _on_fresh_group(comm, off_on: int | None):
    if off_on is not None and comm.rank == off_on:
        os.environ[_shared_rows.ENV] = "0"
    try:
        c = Communicator(timeout=30).new_group(range(comm.world_size))
    finally:
        os.environ.pop(_shared_rows.ENV, None)
    engine = c._engine
    shared = engine.kept.get("shared")
    r, n = c.rank, c.world_size
    x = torch.arange(4.0) + r
    results = []
    for _ in range(3):  # first and steady calls
        y = x.clone()
        c.all_reduce(y)
        b = torch.full((3,), float(r))
        c.broadcast(b, src=n - 1)
        out = torch.zeros(n * 2)
        c.all_to_all_single(out, torch.arange(2.0 * n) + 10 * r)
        got = c.all_gather(torch.full((r + 1,), float(r)))
        results.append(
            (
                y.tolist(),
                b.tolist(),
                out.tolist(),
                [t.tolist() for t in got],
                c.all_gather_object({"r": r}),
            )
        )
    lanes = [k for k, lane in engine.lanes.items() if lane is not None and lane.via == "shared"]
    return shared is not None, bool(lanes), results


@pytest.mark.parametrize("off_on", [None, 0, "last"])
def test_a_new_group_shares_its_rounds_unless_a_rank_turns_it_off(multi_world, off_on):
    n = multi_world.size
    off = n - 1 if off_on == "last" else off_on
    outs = multi_world.run(_on_fresh_group, off)
    share = off is None
    for rank, (shared, took_lanes, results) in enumerate(outs):
        assert shared == share and took_lanes == share
        for y, b, out, got, objs in results:
            assert y == [sum(i + r for r in range(n)) for i in range(4)]
            assert b == [float(n - 1)] * 3
            assert out == [float(2 * rank + k + 10 * j) for j in range(n) for k in range(2)]
            assert got == [[float(r)] * (r + 1) for r in range(n)]
            assert objs == [{"r": r} for r in range(n)]


def _on_one_rank_stays_away(comm):
    c = Communicator(timeout=2).new_group(range(comm.world_size))
    assert c._engine.kept.get("shared") is not None
    c.all_reduce(torch.ones(2))  # one steady round first
    if c.rank == 0:
        time.sleep(4)  # past the others' timeout: they wait in the shared round
        return "away"
    start = time.monotonic()
    try:
        c.all_reduce(torch.ones(2))
    except CommTimeoutError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "finished"


def test_a_rank_that_stays_away_makes_the_others_time_out(world3):
    outs = world3.run(_on_one_rank_stays_away)
    assert outs[0] == "away"
    for name, text, seconds in outs[1:]:
        assert name == "CommTimeoutError"
        assert "within 2s" in text and "rank 0" in text, text
        assert seconds < 10


def _on_killed_in_a_shared_round(comm):
    c = Communicator(timeout=30).new_group(range(comm.world_size))
    c.all_reduce(torch.ones(2))
    if c.rank == c.world_size - 1:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
        time.sleep(5)
    start = time.monotonic()
    try:
        c.all_reduce(torch.ones(2))
    except CommError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "finished"


@pytest.mark.slow
def test_a_rank_killed_while_the_others_wait_in_a_shared_round_is_named():
    world = World(3, timeout=60, pg_timeout=20).start()
    try:
        outcomes = world.outcomes(_on_killed_in_a_shared_round, timeout=60)
    finally:
        world.kill()
    assert isinstance(outcomes[2].error, RankDied)
    for o in outcomes[:2]:
        name, text, seconds = (
            o.value if o.error is None else (type(o.error).__name__, str(o.error), 0)
        )
        assert name == "RankLostError", (name, text)
        assert "rank 2" in text, text
        assert seconds < 15  # long before the 30 s timeout


def test_a_late_rank_does_not_complete_a_round_the_group_gave_up():
    a, b = _pair(2)
    work_a = a.lane(16, False).call(torch.zeros(32, dtype=torch.uint8), _row(1, 16), None)
    with pytest.raises(RuntimeError, match="Operation timed out"):
        work_a.wait(_seconds(0.05))
    a.abort()  # what the engine does when its group breaks
    late = b.lane(16, False).call(torch.zeros(32, dtype=torch.uint8), _row(2, 16), None)
    with pytest.raises(RuntimeError, match="gave up on it"):
        late.wait(_seconds(5))
