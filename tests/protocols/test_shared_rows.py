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


def test_only_the_bytes_written_are_copied_in_and_out():
    # a root's 48 bytes and the others' 8 in rows of 64: each gathered row gets what its
    # rank wrote, and the rest of the rows stays as it was
    ranks = _pair(3)
    outs = [torch.full((3 * 64,), 9, dtype=torch.uint8) for _ in ranks]
    for round_ in range(3):  # both generations, then the first again
        works = [
            r.lane(64, False).call(outs[i], _row(10 * round_ + i, 48 if i == 1 else 8), None)
            for i, r in enumerate(ranks)
        ]
        for work in works:
            work.wait()
        for out in outs:
            rows = out.view(3, 64)
            assert rows[:, 0].tolist() == [10 * round_ + i for i in range(3)]
            assert rows[1, :48].tolist() == [10 * round_ + 1] * 48
            # past the longest row written (a small round copies up to it from every rank)
            assert rows[0, 48:].tolist() == rows[2, 48:].tolist() == [9] * 16


def test_rows_apart_written_short_reach_their_rank():
    a, b = _pair(2)
    outs = [torch.zeros(2 * 64, dtype=torch.uint8) for _ in range(2)]
    sent = [torch.stack([_row(10 * i + j) for j in range(2)]) for i in range(2)]
    # rank 0 writes 40 bytes of each row, rank 1 its header's 8
    works = [
        a.lane(64, True).call(outs[0], sent[0][:, :40], [], [], None),
        b.lane(64, True).call(outs[1], sent[1][:, :8], [], [], None),
    ]
    for w in works:
        w.wait()
    for j, out in enumerate(outs):
        rows = out.view(2, 64)
        assert rows[0, :40].tolist() == [j] * 40 and rows[1, :8].tolist() == [10 + j] * 8
        assert rows[1, 8:].tolist() == [0] * 56


def test_no_sharing_where_dev_shm_cannot_hold_the_segment_twice(monkeypatch):
    # a write past what /dev/shm holds would end the process: such ranks keep the engine
    size = _shared_rows._data_at(2) + 2 * 2 * _shared_rows._area_for(2)
    monkeypatch.delenv(_shared_rows.ENV, raising=False)
    monkeypatch.setattr(_shared_rows, "_shm_free", lambda: 2 * size - 1)
    assert not _shared_rows._willing(size)
    monkeypatch.setattr(_shared_rows, "_shm_free", lambda: 2 * size)
    assert _shared_rows._willing(size) is (os.uname().machine in ("x86_64", "amd64"))


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


def _waiting_in_the_futex(monkeypatch, rows: SharedRows) -> threading.Event:
    # set once ``rows`` goes to sleep in the kernel; looks at peers far apart, so only a
    # publish (or the deadline) ends the sleep
    if rows.futex is None:
        pytest.skip("no futexes on this platform")
    monkeypatch.setattr(_shared_rows, "_LOOK", 3600.0)
    entered, real = threading.Event(), rows.futex.wait

    def wait(offset: int, seen: int, seconds: float) -> bool:
        entered.set()
        return real(offset, seen, seconds)

    monkeypatch.setattr(rows.futex, "wait", wait)
    return entered


def _in_thread(work) -> tuple[threading.Thread, list]:
    got: list = []

    def run():
        try:
            got.append(work.wait(_seconds(3600)))
        except RuntimeError as e:
            got.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


def test_a_rank_asleep_in_the_futex_wakes_when_its_peer_publishes(monkeypatch):
    a, b = _pair(2)
    entered = _waiting_in_the_futex(monkeypatch, a)
    out = torch.zeros(2 * 16, dtype=torch.uint8)
    thread, got = _in_thread(a.lane(16, False).call(out, _row(1, 16), None))
    assert entered.wait(30)
    time.sleep(0.2)  # into the kernel's wait (a publish before it would return at once)
    assert thread.is_alive()  # asleep: nothing but b's publish ends it (no look for an hour)
    b.lane(16, False).call(torch.zeros(32, dtype=torch.uint8), _row(2, 16), None).wait()
    thread.join(30)
    assert not thread.is_alive() and got == [True]
    assert out.view(2, 16)[:, 0].tolist() == [1, 2]


def test_a_rank_asleep_in_the_futex_still_times_out_and_sees_the_group_give_up(monkeypatch):
    a, b = _pair(2)
    entered = _waiting_in_the_futex(monkeypatch, a)
    work = a.lane(16, False).call(torch.zeros(32, dtype=torch.uint8), _row(1, 16), None)
    with pytest.raises(RuntimeError, match=r"Operation timed out.*ranks \[1\]"):
        work.wait(_seconds(0.2))  # the deadline ends the sleep
    assert entered.is_set() and not work.is_completed()
    # asleep again, with no deadline: another rank gives up on the segment (no wake-up)
    # and the next look at the peers sees it
    monkeypatch.setattr(_shared_rows, "_LOOK", 0.05)
    entered.clear()
    thread, got = _in_thread(work)
    assert entered.wait(30)
    b.abort()
    thread.join(30)
    assert not thread.is_alive()
    assert len(got) == 1 and "gave up on it" in str(got[0])


def _seconds(s: float):
    import datetime

    return datetime.timedelta(seconds=s)


def _ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    return child.pid


def test_segments_a_killed_rank_0_left_behind_are_swept():
    stale = f"/dev/shm/commlib-rows-{_ended_pid()}-leftover"
    live = f"/dev/shm/commlib-rows-{os.getpid()}-in-set-up"
    other = f"/dev/shm/not-commlib-{_ended_pid()}"
    for path in (stale, live, other):
        open(path, "wb").close()
    try:
        assert stale in _shared_rows.sweep_stale()
        assert not os.path.exists(stale)
        assert os.path.exists(live) and os.path.exists(other)
    finally:
        for path in (stale, live, other):
            if os.path.exists(path):
                os.unlink(path)


# -- real ranks --------------------------------------------------------------------------
def _on_a_leftover_segment(comm, leftover: str) -> bool:
    if comm.rank == 0:
        open(leftover, "wb").close()  # as a rank 0 SIGKILLed in its set-up leaves it
    comm.barrier()
    c = Communicator(timeout=30).new_group(range(comm.world_size))
    shares = c._engine.kept.get("shared") is not None
    gone = c.all_gather_object(not os.path.exists(leftover))
    return shares and all(gone)


def test_a_new_groups_rank_0_sweeps_a_leftover_segment(world3):
    leftover = f"/dev/shm/commlib-rows-{_ended_pid()}-leftover"
    try:
        assert world3.run(_on_a_leftover_segment, leftover) == [True] * 3
    finally:
        if os.path.exists(leftover):
            os.unlink(leftover)


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


# -- one-way calls' data riding in the shared round, past the engine's 128 KiB -----------
def _apart_view(t: torch.Tensor) -> torch.Tensor:
    # ``t``'s values in every other element of a larger tensor: not contiguous
    every = torch.zeros(2 * t.numel(), dtype=t.dtype)
    every[1::2] = t
    return every[1::2]


def _one_way(comm) -> list[str]:
    # broadcast, scatter and reduce of 400 KB and 1 MB, several dtypes, contiguous and
    # not: every result equals the unchecked one bit for bit, and a steady call whose
    # data fits the segment's room takes one round (its data rode in it)
    from commlib._rooms import HEADER

    c = Communicator(timeout=60).new_group(range(comm.world_size))
    plain = Communicator(c.group, strict=False, timeout=60)
    shared = c._engine.kept.get("shared")
    if shared is None:
        return ["the group does not share its rounds"]
    world, rank, engine = c.world_size, c.rank, c._engine
    wrong, rode = [], 0

    def rounds(call, *args) -> int:
        before = engine.seq
        call(*args)
        return engine.seq - before

    for n in (100_000, 250_000):
        for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.complex64):

            def filled(value: int, count: int = n, dtype: torch.dtype = dtype) -> torch.Tensor:
                # integers: exact in every dtype, so any reduction order gives the same bits
                return (torch.arange(count) % 7 + value).to(dtype)

            nbytes = filled(0).nbytes
            fits = nbytes + HEADER + 16 <= shared.area
            fits_apart = shared.fits(HEADER + (nbytes + 15) // 16 * 16, True)
            for odd in (False, True):
                for call in range(4):
                    steady = call == 3 and not odd
                    src = world - 1
                    # broadcast
                    got, want = filled(rank), filled(rank)
                    if odd:  # non-contiguous: every other element of a larger tensor
                        got = _apart_view(got)
                    took = rounds(c.broadcast, got, src)
                    plain.broadcast(want, src)
                    if not torch.equal(got, want):
                        wrong.append(f"broadcast {n} {dtype} odd={odd}")
                    if steady and fits:
                        rode += 1
                        if took != 1:
                            wrong.append(f"broadcast {n} {dtype}: {took} rounds")
                    # scatter
                    parts = [filled(10 * j + 1) for j in range(world)] if rank == src else None
                    if odd and parts is not None:
                        parts = [_apart_view(p) for p in parts]
                    piece, want = (
                        torch.zeros(2 * n, dtype=dtype)[::2] if odd else filled(0),
                        filled(0),
                    )
                    took = rounds(c.scatter, piece, parts, src)
                    plain.scatter(want, parts, src)
                    if not torch.equal(piece, want):
                        wrong.append(f"scatter {n} {dtype} odd={odd}")
                    if steady and fits_apart and took != 1:
                        wrong.append(f"scatter {n} {dtype}: {took} rounds")
                    # reduce (sum; max for complex, which has no order: sum there too)
                    got, want = filled(rank + 1), filled(rank + 1)
                    if odd:
                        got = _apart_view(got)
                    took = rounds(c.reduce, got, 0)
                    plain.reduce(want, 0)
                    if rank == 0 and not torch.equal(got, want):
                        wrong.append(f"reduce {n} {dtype} odd={odd}")
                    if rank != 0 and not torch.equal(got, filled(rank + 1)):
                        wrong.append(f"reduce {n} {dtype} odd={odd}: a non-dst input changed")
                    if steady and fits and took != 1:
                        wrong.append(f"reduce {n} {dtype}: {took} rounds")
    if not rode:
        wrong.append("no call rode")
    return wrong


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_way_calls_ride_in_the_shared_round_past_the_engines_cap(multi_world):
    assert multi_world.run(_one_way, timeout=500) == [[]] * multi_world.size


def _after_a_large_one_way_call(comm) -> list[str]:
    # a 1 MB broadcast teaches the slot 1 MB: the other protocols' rounds then copy only
    # the bytes their rows hold, and every result is still right (no byte of an earlier
    # round read as data)
    c = Communicator(timeout=60).new_group(range(comm.world_size))
    world, rank = c.world_size, c.rank
    wrong = []
    for call in range(3):
        big = torch.full((250_000,), float(rank))
        c.broadcast(big, 0)
        if not torch.equal(big, torch.zeros(250_000)):
            wrong.append(f"broadcast {call}")
        for n in (3, 1):  # a shorter row after a longer one
            got = c.all_gather(torch.full((n + rank,), float(10 * call + rank)))
            want = [torch.full((n + r,), float(10 * call + r)) for r in range(world)]
            if not all(torch.equal(g, w) for g, w in zip(got, want)):
                wrong.append(f"all_gather {call} {n}: {got}")
        out = c.all_gather_object({"rank": rank, "call": call})
        if out != [{"rank": r, "call": call} for r in range(world)]:
            wrong.append(f"all_gather_object {call}: {out}")
        x = torch.full((4,), float(rank + call))
        c.all_reduce(x)
        if x.tolist() != [float(sum(r + call for r in range(world)))] * 4:
            wrong.append(f"all_reduce {call}: {x}")
    return wrong


def test_other_rounds_after_a_large_one_way_call_are_right(multi_world):
    assert multi_world.run(_after_a_large_one_way_call, timeout=120) == [[]] * multi_world.size
