"""Observers, the flight recorder, statistics, profiler labels and `commlib trace`, one process.

The multi-rank behaviour (every rank writes when one fails, ``commlib trace``
naming the rank that diverged, a third-party observer installed as a
distribution) is in ``tests/observability/test_observe_world.py``.
"""

from __future__ import annotations

import ast
import gc
import json
import os
import re
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pluggy
import pytest
import torch
import torch.distributed as dist

import commlib
from commlib import Communicator, hookimpl
from commlib.cli import main as cli
from commlib.observe import (
    CollectiveStats,
    FlightRecorder,
    diagnosis,
    disable_flight_recorder,
    dispatch,
    enable_flight_recorder,
    trace_files,
)
from commlib.observe.event import CollectiveEvent, payload_facts
from commlib.plugins import list_observers, plugin_manager

ROOT = Path(__file__).parents[2]


@pytest.fixture(autouse=True)
def _not_distributed():
    assert not dist.is_initialized()


class Watcher:
    """An observer that keeps what it is told."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    @hookimpl
    def commlib_collective_start(self, event):
        self.seen.append(("start", event.name, event.seq, event.describe(), event.state))

    @hookimpl
    def commlib_collective_end(self, event):
        assert event.duration is not None and event.duration >= 0
        self.seen.append(("end", event.name, event.seq, event.state, event.error))


@pytest.fixture
def watcher():
    w = Watcher()
    plugin_manager().register(w)
    yield w
    plugin_manager().unregister(w)


def test_every_collective_reaching_the_engine_is_seen_once(watcher):
    comm = Communicator()
    comm.all_reduce(torch.ones(4), op="mean")
    comm.broadcast(torch.ones(2, dtype=torch.int64), src=0)
    comm.all_gather(torch.ones(3))
    comm.barrier()
    names = [s[1] for s in watcher.seen if s[0] == "start"]
    assert names == ["all_reduce", "broadcast", "all_gather", "barrier"]
    assert watcher.seen[0] == ("start", "all_reduce", 1, "mean, float32 (4,)", "started")
    assert watcher.seen[1] == ("end", "all_reduce", 1, "completed", None)
    assert watcher.seen[2][3] == "src 0, int64 (2,)"
    seqs = [s[2] for s in watcher.seen if s[0] == "start"]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_a_refused_call_is_no_collective(watcher):
    comm = Communicator()
    with pytest.raises(ValueError):
        comm.all_reduce(torch.ones(2), op="nope")
    with pytest.raises(TypeError):
        comm.broadcast([1, 2], async_op=True)  # async_op takes tensors only
    assert watcher.seen == []
    comm.all_reduce(torch.ones(2))
    assert [s[:3] for s in watcher.seen] == [("start", "all_reduce", 1), ("end", "all_reduce", 1)]


def test_an_async_collective_ends_when_its_handle_is_waited_on(watcher):
    comm = Communicator()
    handle = comm.all_reduce(torch.ones(2), async_op=True)
    assert [s[0] for s in watcher.seen] == ["start"]
    assert handle.wait() is True and handle.is_completed()
    assert [s[:4] for s in watcher.seen][-1] == ("end", "all_reduce", 1, "completed")
    handle.wait()  # a second wait tells nobody again
    assert len(watcher.seen) == 2


def test_an_observed_handle_s_future_ends_the_collective_once(watcher):
    x = torch.ones(2)
    handle = Communicator().all_reduce(x, async_op=True)
    assert handle.get_future().wait()[0] is x
    handle.wait()
    assert [s[0] for s in watcher.seen] == ["start", "end"]


def test_a_handle_waited_on_again_after_its_wait_failed_ends_once(watcher):
    from commlib.errors import CommTimeoutError

    comm = Communicator()
    handle = comm.all_reduce(torch.ones(2), async_op=True)
    inner = handle._work  # the engine's handle the observed one waits on

    def times_out(timeout):
        raise CommTimeoutError("all_reduce did not complete within 1s")

    inner._wait = times_out
    for _ in range(3):  # a caller retrying its wait
        with pytest.raises(CommTimeoutError):
            handle.wait(timeout=1)
    ends = [s for s in watcher.seen if s[0] == "end"]
    assert len(ends) == 1 and ends[0][3] == "timed out"


def test_a_refusal_survives_pickling():
    import pickle

    from commlib.errors import RemoteArgumentError

    err = pickle.loads(pickle.dumps(RemoteArgumentError("gather", {1: "x"}, "why", refused=True)))
    assert (err.refused, err.failures, str(err)) == (True, {1: "x"}, "gather why: rank 1: x")
    assert not pickle.loads(pickle.dumps(RemoteArgumentError("gather", {1: "x"}))).refused


def test_no_observer_costs_no_hook_lookup_per_call(monkeypatch):
    comm = Communicator()
    comm.barrier()  # the lookup after the last change of registrations
    looked = []
    original = pluggy.HookCaller.get_hookimpls

    def counting(caller):
        if caller.name == "commlib_collective_start":
            looked.append(1)
        return original(caller)

    monkeypatch.setattr(pluggy.HookCaller, "get_hookimpls", counting)
    for _ in range(20):
        comm.all_reduce(torch.ones(1))
    assert looked == []
    w = Watcher()
    plugin_manager().register(w)  # a change of registrations: looked up once more
    looked.clear()
    try:
        for _ in range(5):
            comm.all_reduce(torch.ones(1))
        assert looked == [1]
    finally:
        plugin_manager().unregister(w)
    assert len([s for s in w.seen if s[0] == "start"]) == 5


class Raising:
    fixed = False
    started = 0

    @hookimpl
    def commlib_collective_start(self, event):
        self.started += 1
        if not self.fixed:
            raise RuntimeError("observer bug")


def test_an_observer_that_raises_is_disabled_and_the_collective_goes_on(watcher):
    bad = Raising()
    plugin_manager().register(bad, name="raising-observer")
    try:
        comm = Communicator()
        x = torch.ones(2)
        with pytest.warns(RuntimeWarning, match="observer bug"):
            comm.all_reduce(x)
        comm.all_reduce(x)  # no second warning: it no longer observes
        assert x.tolist() == [1.0, 1.0]
        assert len([s for s in watcher.seen if s[0] == "end"]) == 2
        assert "raising-observer" in dispatch.disabled()
        out = _info()
        assert "observer disabled: raising-observer: RuntimeError: observer bug" in out
    finally:
        plugin_manager().unregister(bad)
    assert dispatch.disabled() == {}  # forgotten once unregistered


def test_an_observer_registered_again_observes_again():
    bad = Raising()
    pm = plugin_manager()
    pm.register(bad)
    comm = Communicator()
    with pytest.warns(RuntimeWarning, match="observer bug"):
        comm.all_reduce(torch.ones(2))
    bad.fixed = True
    pm.unregister(bad)
    pm.register(bad)  # at once: nothing looked for observers in between
    try:
        comm.all_reduce(torch.ones(2))
        assert bad.started == 2 and dispatch.disabled() == {}
    finally:
        pm.unregister(bad)


def _info() -> str:
    import io

    from commlib.cli import info

    buf = io.StringIO()
    info(buf)
    return buf.getvalue()


def test_commlib_info_names_the_observers(watcher):
    assert any("Watcher" in name for name in list_observers())
    assert "observers: " in _info()


def test_profiler_shows_commlib_collectives_with_their_sizes():
    comm = Communicator()
    with torch.profiler.profile() as prof:
        comm.all_reduce(torch.ones(4))
        comm.broadcast(torch.ones(2, 3), src=0)
    names = {e.key for e in prof.key_averages()}
    assert "commlib.all_reduce(sum, float32 (4,))" in names
    assert "commlib.broadcast(src 0, float32 (2, 3))" in names


def test_a_relative_trace_directory_is_where_it_was_when_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recorder = FlightRecorder(directory="traces")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # as hydra does, per run
    (tmp_path / "traces").mkdir()
    assert recorder.dump("asked") == tmp_path / "traces" / "commlib_trace_rank0.json"


def test_flight_recorder_keeps_the_last_collectives(tmp_path):
    recorder = FlightRecorder(capacity=3)
    plugin_manager().register(recorder)
    try:
        comm = Communicator()
        for _ in range(5):
            comm.all_reduce(torch.ones(2))
        comm.barrier()
    finally:
        plugin_manager().unregister(recorder)
    snap = recorder.snapshot("asked")
    assert snap["recorded"] == 6 and len(snap["entries"]) == 3
    assert [e["name"] for e in snap["entries"]] == ["all_reduce", "all_reduce", "barrier"]
    assert all(e["state"] == "completed" and e["end"] >= e["start"] for e in snap["entries"])
    # every Communicator() here is a new one over the same (absent) group: world#N
    assert list(snap["groups"].values()) == [[0]] and snap["rank"] == 0
    assert next(iter(snap["groups"])).startswith("world")
    path = recorder.dump("asked", tmp_path)
    assert path == trace_files.path_for(tmp_path, 0)
    assert json.loads(path.read_text())["entries"] == snap["entries"]


def test_flight_recorder_ring_reuses_its_slots_oldest_first():
    recorder = FlightRecorder(capacity=2)
    plugin_manager().register(recorder)
    try:
        comm = Communicator()
        late = comm.all_reduce(torch.ones(2), async_op=True)  # record 1, still open
        comm.broadcast(torch.ones(2), src=0)  # record 2
        ring = recorder._started
        for _ in range(2):  # records 3 and 4 fill both slots again
            comm.all_gather_into_tensor(torch.empty(2), torch.ones(2))
        late.wait()  # its slot holds record 3 now: the late end leaves it alone
        names = [e["name"] for e in recorder.snapshot()["entries"]]
        states = [e["state"] for e in recorder.snapshot()["entries"]]
        comm.barrier()  # record 5: the oldest slot, record 3's
        after = [e["name"] for e in recorder.snapshot()["entries"]]
    finally:
        plugin_manager().unregister(recorder)
    assert names == ["all_gather_into_tensor", "all_gather_into_tensor"]
    assert states == ["completed", "completed"]
    assert after == ["all_gather_into_tensor", "barrier"]
    # the same two slots, written over: the ring never grows
    assert recorder._started is ring and len(ring) == 2 and recorder.recorded == 5


def test_an_event_starts_at_the_wall_clock_time_of_its_call():
    # start is time.time() at the call, derived from the span's perf_counter reading
    events = []

    class Starts:
        @hookimpl
        def commlib_collective_start(self, event):
            events.append(event)

    starts = Starts()
    plugin_manager().register(starts)
    try:
        comm = Communicator()
        before = time.time()
        comm.all_reduce(torch.ones(2))
        comm.broadcast(torch.ones(2), src=0)
        after = time.time()
    finally:
        plugin_manager().unregister(starts)
    assert [e.name for e in events] == ["all_reduce", "broadcast"]
    # the clocks are read a few microseconds apart: a millisecond either side is plenty
    assert before - 1e-3 <= events[0].start <= events[1].start <= after + 1e-3
    assert events[0].start + events[0].duration <= events[1].start + 1e-3


def test_hooks_that_take_no_event_are_called_without_one():
    calls = []

    class Counter:
        @hookimpl
        def commlib_collective_start(self):
            calls.append("start")

        @hookimpl
        def commlib_collective_end(self):
            calls.append("end")

    counter = Counter()
    plugin_manager().register(counter)
    try:
        Communicator().all_reduce(torch.ones(2))
    finally:
        plugin_manager().unregister(counter)
    assert calls == ["start", "end"] and dispatch.disabled() == {}


def test_the_flight_recorder_keeps_no_communicator_alive():
    recorder = FlightRecorder(capacity=4)
    plugin_manager().register(recorder)
    try:
        comm = Communicator()
        comm.broadcast(torch.ones(3), src=0)
        gone = weakref.ref(comm)
        del comm
        gc.collect()
        entry = recorder.snapshot()["entries"][-1]
    finally:
        plugin_manager().unregister(recorder)
    assert gone() is None
    assert (entry["name"], entry["peers"], entry["shapes"], entry["nbytes"]) == (
        "broadcast",
        {"src": 0},
        [[3]],
        12,
    )


def test_enable_flight_recorder_registers_once():
    try:
        first = enable_flight_recorder()
        assert enable_flight_recorder() is first
        assert "commlib.flight_recorder" in list_observers()
    finally:
        disable_flight_recorder()
    assert "commlib.flight_recorder" not in list_observers()


def test_statistics(tmp_path):
    stats = CollectiveStats()
    plugin_manager().register(stats)
    try:
        comm = Communicator()
        comm.all_reduce(torch.ones(4))
        comm.all_reduce(torch.ones(8))
        comm.barrier()
    finally:
        plugin_manager().unregister(stats)
    (group,) = stats.as_dict()
    row = stats.as_dict()[group]["all_reduce"]
    assert row["count"] == 2 and row["bytes"] == 48 and row["errors"] == 0
    assert "all_reduce" in stats.table() and "barrier" in stats.table()
    written = stats.report(str(tmp_path))
    assert json.loads(written.read_text())["groups"][group]["barrier"]["count"] == 1


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), full.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120
    )


RUN = "import torch, commlib; [commlib.all_reduce(torch.ones(3)) for _ in range(4)]"


def test_environment_switches_the_built_in_observers_on(tmp_path):
    proc = _python(RUN, COMMLIB_TRACE_DIR=str(tmp_path), COMMLIB_STATS="1")
    assert proc.returncode == 0, proc.stderr
    assert "commlib statistics, rank 0:" in proc.stderr and "all_reduce" in proc.stderr
    snap = json.loads(trace_files.path_for(tmp_path, 0).read_text())
    assert snap["reason"] == "exit" and len(snap["entries"]) == 4
    # a bad capacity is a warning, not a job that stops: observing never breaks it
    for wrong in ("lots", "0"):
        bad = _python(RUN, COMMLIB_TRACE_DIR=str(tmp_path), COMMLIB_TRACE_CAPACITY=wrong)
        assert bad.returncode == 0, bad.stderr
        assert f"COMMLIB_TRACE_CAPACITY='{wrong}' is not a positive whole number" in bad.stderr


# -- commlib trace on files written by hand: the cases the diagnosis must name -----------
def _entry(seq, name, state="completed", **extra):
    entry = {
        "group": "world",
        "seq": seq,
        "name": name,
        "rank": 0,
        "shapes": [[4]],
        "dtypes": ["float32"],
        "nbytes": 16,
        "peers": {},
        "op": None,
        "uniform": True,
        "start": 100.0 + seq,
        "end": None if state == "started" else 100.5 + seq,
        "state": state,
        "error": None,
    }
    entry.update(extra)
    return entry


def _write(
    directory, rank, entries, world=3, recorded=None, reason="exit", run=None, written=200.0
):
    trace_files.write(
        directory,
        {
            "format": trace_files.FORMAT,
            "rank": rank,
            "world_size": world,
            "run": run,
            "written": written,
            "reason": reason,
            "recorded": len(entries) if recorded is None else recorded,
            "groups": {"world": list(range(world))},
            "entries": entries,
        },
    )


def test_trace_names_the_rank_in_a_different_collective(tmp_path, capsys):
    for r in (0, 1):
        _write(
            tmp_path,
            r,
            [_entry(1, "all_reduce"), _entry(3, "broadcast", "timed out", peers={"src": 0})],
        )
    _write(tmp_path, 2, [_entry(1, "all_reduce"), _entry(3, "all_reduce", "timed out", op="sum")])
    found = diagnosis.diagnose(tmp_path)
    (group,) = found["groups"]
    assert group["first_disagreement"] == 3
    assert [p["ranks"] for p in group["parties"]] == [[0, 1], [2]]
    assert found["verdict"] == [
        "rank 2 called all_reduce #3 (sum, float32 (4,)) where ranks 0, 1 called "
        "broadcast #3 (src 0, float32 (4,))"
    ]
    assert cli(["trace", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "first disagreement at #3:" in text and "ranks 0, 1" in text
    assert cli(["trace", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == found["verdict"]


def test_trace_names_a_rank_that_never_arrived(tmp_path):
    for r in (0, 1):
        _write(
            tmp_path,
            r,
            [
                _entry(1, "all_reduce"),
                _entry(2, "all_gather_object", uniform=False),
                _entry(4, "all_reduce", "started"),
            ],
        )
    _write(tmp_path, 2, [_entry(1, "all_reduce"), _entry(2, "all_gather_object", uniform=False)])
    found = diagnosis.diagnose(tmp_path)
    assert found["verdict"] == [
        "rank 2 never arrived at all_reduce #4 (last: all_gather_object #2, completed)"
    ]
    assert "in flight for 96.0s" in diagnosis.render(found)


def test_trace_leaves_point_to_point_out_of_the_line_up_and_shows_a_rank_stuck_in_one(tmp_path):
    # ranks 0 and 1 exchanged point to point (numbered apart), then rank 1 waits in a
    # recv rank 2 never sends, while 0 and 2 wait in all_reduce #3 for it
    p2p = {"point_to_point": True, "uniform": False}
    _write(
        tmp_path,
        0,
        [
            _entry(1, "all_reduce"),
            _entry(1, "send", peers={"dst": 1}, **p2p),
            _entry(3, "all_reduce", "started", op="sum"),
        ],
    )
    _write(
        tmp_path,
        1,
        [
            _entry(1, "all_reduce"),
            _entry(1, "recv", peers={"src": 0}, **p2p),
            _entry(2, "recv", "started", peers={"src": 2}, **p2p),
        ],
    )
    _write(tmp_path, 2, [_entry(1, "all_reduce"), _entry(3, "all_reduce", "started", op="sum")])
    found = diagnosis.diagnose(tmp_path)
    (group,) = found["groups"]
    assert group["first_disagreement"] == 3
    assert found["verdict"] == ["rank 1 never arrived at all_reduce #3 (last: recv #2, started)"]
    assert group["last"]["1"]["name"] == "recv"
    text = diagnosis.render(found)
    assert "rank 1: recv #2 (src 2, float32 (4,)): in flight" in text


def test_trace_names_ranks_stuck_in_point_to_point_one_by_one(tmp_path):
    # two ranks' "recv #1" are each rank's own first receive, not one call
    p2p = {"point_to_point": True, "uniform": False}
    for r in (0, 1):
        _write(
            tmp_path,
            r,
            [_entry(1, "barrier"), _entry(1, "recv", "timed out", peers={"src": 1 - r}, **p2p)],
            world=2,
        )
    found = diagnosis.diagnose(tmp_path)
    assert found["verdict"] == [
        "the ranks agree on every collective recorded; rank 0 timed out in recv #1; "
        "rank 1 timed out in recv #1"
    ]


def test_trace_names_missing_files_and_where_the_others_failed(tmp_path):
    for r in (0, 1):
        _write(
            tmp_path,
            r,
            [
                _entry(1, "all_reduce"),
                _entry(2, "all_gather_object", "failed", error="CommError: reset"),
            ],
        )
    found = diagnosis.diagnose(tmp_path)
    assert found["missing_files"] == [2]
    assert found["verdict"] == [
        "rank 2 left no trace file (killed, or another directory); "
        "ranks 0, 1 failed in all_gather_object #2"
    ]


def test_trace_names_a_rank_that_arrived_after_the_others_gave_up(tmp_path):
    # rank 2 was late: the others timed out in #3 and wrote; rank 2 wrote again at
    # its own failure, its #3 in the file: only the times tell it came late
    for r in (0, 1):
        _write(tmp_path, r, [_entry(1, "all_reduce"), _entry(3, "all_reduce", "timed out")])
    late = _entry(3, "all_reduce", "failed", start=108.0, error="CommBrokenError: gave up")
    _write(tmp_path, 2, [_entry(1, "all_reduce"), late])
    found = diagnosis.diagnose(tmp_path)
    (group,) = found["groups"]
    assert group["late"] == [
        {"rank": 2, "name": "all_reduce", "seq": 3, "after_seconds": 4.5, "gave_up": 0}
    ]
    assert found["verdict"][0] == (
        "rank 2 arrived at all_reduce #3 4.5s after rank 0 had given up on it (timed out)"
    )
    # on time (started before anyone gave up): the ranks simply agree
    _write(tmp_path, 2, [_entry(1, "all_reduce"), _entry(3, "all_reduce", "timed out")])
    assert diagnosis.diagnose(tmp_path)["groups"][0]["late"] == []


def test_trace_leaves_out_files_an_earlier_run_left_in_the_directory(tmp_path, capsys):
    # run 1 was healthy; run 2 (the same directory) lost rank 2, killed: its file is run 1's
    _write(tmp_path, 2, [_entry(1, "all_reduce"), _entry(2, "all_gather_object")], run="a")
    for r in (0, 1):
        failed = _entry(2, "all_gather_object", "failed", error="CommError: reset")
        _write(tmp_path, r, [_entry(1, "all_reduce"), failed], run="b", written=900.0)
    found = diagnosis.diagnose(tmp_path)
    assert found["other_run"] == {2: 200.0} and found["missing_files"] == [2]
    assert found["verdict"] == [
        "rank 2 left no trace file (killed, or another directory); "
        "ranks 0, 1 failed in all_gather_object #2",
        "the files of rank 2 are from an earlier run and were left out",
    ]
    assert cli(["trace", str(tmp_path)]) == 0
    assert "left out: rank 2's file is from an earlier run (written " in capsys.readouterr().out
    # files of one run, or without run ids (written by hand, or no store): all read
    _write(tmp_path, 2, [_entry(1, "all_reduce")], run=None)
    assert diagnosis.diagnose(tmp_path)["other_run"] == {}
    # the newest file carries no id: nothing to tell the runs apart by
    _write(tmp_path, 2, [_entry(1, "all_reduce")], run="a")
    _write(tmp_path, 1, [_entry(1, "all_reduce")], run=None, written=1000.0)
    assert diagnosis.diagnose(tmp_path)["other_run"] == {}


def test_trace_names_ranks_that_stopped_differently_in_one_collective(tmp_path):
    # the peer of a killed rank may time out or see the connection drop: same place
    _write(tmp_path, 0, [_entry(1, "all_reduce"), _entry(2, "all_reduce", "timed out")])
    _write(
        tmp_path,
        1,
        [_entry(1, "all_reduce"), _entry(2, "all_reduce", "failed", error="CommError: reset")],
    )
    found = diagnosis.diagnose(tmp_path)
    assert found["verdict"] == [
        "rank 2 left no trace file (killed, or another directory); "
        "ranks 0, 1 stopped in all_reduce #2 (rank 0 timed out, rank 1 failed)"
    ]


def test_trace_compares_only_what_every_rank_still_holds(tmp_path):
    # rank 0 dropped its oldest records: numbers below its oldest kept one are not compared
    _write(tmp_path, 0, [_entry(5, "all_reduce"), _entry(6, "barrier")], world=2, recorded=6)
    _write(
        tmp_path,
        1,
        [_entry(s, "all_reduce") for s in range(1, 6)] + [_entry(6, "barrier")],
        world=2,
    )
    found = diagnosis.diagnose(tmp_path)
    assert found["groups"][0]["first_disagreement"] is None
    assert found["verdict"] == ["the ranks agree on every collective recorded"]


def test_trace_does_not_blame_a_rank_whose_records_of_a_group_all_dropped(tmp_path):
    # the capacity is shared by every group: ranks 0 and 1 dropped their world records
    # after many subgroup calls; rank 2 still holds the world's
    sub = [_entry(s, "all_reduce", group="sub") for s in range(1, 4)]
    for r in (0, 1):
        _write(tmp_path, r, sub, recorded=6)
    _write(tmp_path, 2, [_entry(1, "all_reduce"), _entry(2, "barrier")])
    found = diagnosis.diagnose(tmp_path)
    assert found["verdict"] == ["the ranks agree on every collective recorded"]


def test_trace_and_stats_of_an_empty_folder_fail_saying_so(tmp_path, capsys):
    # a wrong folder (or one no rank wrote to) must not read as a clean bill to a script
    assert cli(["trace", str(tmp_path)]) == 1
    assert "no commlib trace files here" in capsys.readouterr().out
    assert cli(["trace", str(tmp_path), "--stacks"]) == 1
    assert cli(["stats", str(tmp_path)]) == 1
    assert "no statistics files" in capsys.readouterr().out


def test_new_group_names_itself_when_a_rank_is_out_of_range():
    with pytest.raises(ValueError, match=r"new_group\(\[0, 5\]\): rank=5 is out of range"):
        Communicator().new_group([0, 5])


def test_trace_of_an_empty_or_missing_directory(tmp_path, capsys):
    assert diagnosis.diagnose(tmp_path)["verdict"] == ["no commlib trace files here"]
    (tmp_path / "commlib_trace_rank0.json").write_text("{not json")
    assert diagnosis.diagnose(tmp_path)["unreadable"]
    assert cli(["trace", str(tmp_path / "nope")]) == 2


@pytest.mark.parametrize(
    "damage",
    ["[1, 2]", '{"format": "FORMAT", "rank": 1, "entries": null}', "", "entry without seq"],
)
def test_trace_reads_damaged_files_as_unreadable_not_as_missing(tmp_path, damage):
    for r in (0, 2):
        _write(tmp_path, r, [_entry(1, "all_reduce"), _entry(2, "barrier", "timed out")])
    bad = tmp_path / "commlib_trace_rank1.json"
    if damage == "entry without seq":
        _write(tmp_path, 1, [_entry(1, "all_reduce")])
        bad.write_text(bad.read_text().replace('"seq": 1', '"sequence": 1'))
    else:
        bad.write_text(damage.replace("FORMAT", trace_files.FORMAT))
    found = diagnosis.diagnose(tmp_path)
    assert [u.split(":")[0] for u in found["unreadable"]] == ["commlib_trace_rank1.json"]
    assert found["verdict"] == [
        "rank 1 left a trace file that cannot be read; ranks 0, 2 timed out in barrier #2"
    ]
    assert cli(["trace", str(tmp_path)]) == 0


# -- the shape of the code ---------------------------------------------------------------
def test_every_communicator_method_that_reaches_the_engine_is_observed():
    # the Communicator's own methods and those of the collective families it derives from
    methods = []
    for base in commlib.Communicator.__mro__[:-1]:
        tree = ast.parse(Path(sys.modules[base.__module__].__file__).read_text())
        (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == base.__name__]
        methods += cls.body
    missing = []
    for fn in methods:
        if not isinstance(fn, ast.FunctionDef) or fn.name.startswith("_"):
            continue
        if fn.name == "refusing":
            # not a collective: its refusal joins the round of the collective it names,
            # which the other ranks' observers see (as before it was public)
            continue
        if fn.name == "new_group":
            # a group change, as before its body moved to commlib._membership: `_member`
            # only refuses a non-member, and its round goes over the world's engine
            continue
        calls_member = any(
            isinstance(n, ast.Attribute) and n.attr == "_member" for n in ast.walk(fn)
        )
        decorated = any(
            isinstance(d, ast.Call) and getattr(d.func, "id", "") == "collective"
            for d in fn.decorator_list
        )
        if calls_member and not decorated:
            missing.append(fn.name)
    assert not missing, f"collectives observers would not see (add @collective): {missing}"
    assert commlib.Communicator.all_reduce.__commlib_collective__ == "all_reduce"


def test_the_watcher_stops_asking_a_store_that_is_gone(monkeypatch, tmp_path):
    # rank 0 hosts the store under env:// and may exit first: every later look
    # would log torch's connection warning again
    from commlib.observe import alarm

    class GoneStore:
        asked = 0

        def add(self, key, value):
            self.asked += 1
            raise RuntimeError("Connection was likely closed")

    store = GoneStore()
    monkeypatch.setattr(alarm, "default_store", lambda: store)
    watcher = alarm.Alarm(FlightRecorder(directory=tmp_path))
    for _ in range(3):
        watcher._answer()
    assert store.asked == 1 and list(tmp_path.iterdir()) == []
    # the group started again (Fabric's teardown and setup): its new store is asked
    fresh = GoneStore()
    monkeypatch.setattr(alarm, "default_store", lambda: fresh)
    watcher._answer()
    assert fresh.asked == 1


def test_a_relative_trace_directory_is_taken_from_where_the_program_started(tmp_path):
    code = (
        "import os, torch, commlib; os.mkdir('elsewhere'); os.chdir('elsewhere'); "
        "commlib.all_reduce(torch.ones(1))"
    )
    env = {**os.environ, "COMMLIB_TRACE_DIR": "traces"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "traces" / "commlib_trace_rank0.json").exists()


def test_trace_cuts_long_errors_and_reasons_between_words_with_an_ellipsis(tmp_path, capsys):
    words = " ".join(f"word{i:03d}" for i in range(80))  # 639 characters, no line break
    error = f"CommError: {words}\nsecond line"
    reason = f"all_reduce #2 failed on rank 0 (group world): {words}"
    for r in (0, 1):
        entries = [_entry(1, "all_reduce"), _entry(2, "all_reduce", "failed", error=error)]
        _write(tmp_path, r, entries, world=2, reason=reason)
    assert cli(["trace", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    cut = [line for line in lines if "word000" in line]
    assert len(cut) == 3  # why the files were written, and each rank's last call
    for line in cut:
        assert line.endswith("...") and len(line) <= 360, line
        # the last word shown is whole: a word, then the ellipsis
        assert re.search(r" word\d{3}\.\.\.$", line), line
    assert "second line" not in "\n".join(lines)


def test_shorten_keeps_short_lines_and_cuts_one_long_word_inside_it():
    from commlib.observe._lines import shorten

    assert shorten("all fine", 20) == "all fine"
    assert shorten("", 20) == ""
    assert shorten("/a/very/long/path/without/any/spaces/at/all", 20) == "/a/very/long/path..."
    assert len(shorten("x " * 200, 50)) <= 50


def test_an_observer_describes_a_sparse_tensor_without_failing():
    # its nbytes raises: observers got a RuntimeWarning before the collective's TypeError
    sparse = torch.ones(2).to_sparse()
    assert payload_facts(sparse) == (((2,),), ("float32",), 8)
    assert payload_facts([sparse, torch.ones(3)])[2] == 20


class _Keeper:
    """An observer that keeps every event and reads nothing of it (``read``: fields it reads)."""

    def __init__(self, read: tuple[str, ...] = (), at: str = "start") -> None:
        self.events: list = []
        self.read, self.at, self.values = read, at, []

    @hookimpl
    def commlib_collective_start(self, event):
        self.events.append(event)
        if self.at == "start":
            self.values.append(tuple(getattr(event, f) for f in self.read))

    @hookimpl
    def commlib_collective_end(self, event):
        if self.at == "end":
            self.values.append(tuple(getattr(event, f) for f in self.read))


_PAYLOADS = [
    # (call, the payload facts every observer must see: as payload_facts says)
    (lambda c: c.all_reduce(torch.ones(2, 3)), payload_facts(torch.ones(2, 3))),
    (lambda c: c.all_reduce(torch.ones(4, dtype=torch.int64), "max"), (((4,),), ("int64",), 32)),
    (lambda c: c.broadcast(torch.ones(5), src=0), (((5,),), ("float32",), 20)),
    (lambda c: c.barrier(), ((), (), 0)),
    (
        lambda c: c.all_gather_into_tensor(torch.empty(3), torch.ones(3)),
        payload_facts(torch.ones(3)),
    ),
]


@pytest.mark.parametrize("recorder", [False, True], ids=["lazy", "with_recorder"])
@pytest.mark.parametrize(
    "read, at", [((), ""), (("shapes",), "start"), (("nbytes", "dtypes"), "end")]
)
def test_an_event_s_payload_facts_are_the_same_whenever_they_are_read(recorder, read, at):
    # without an observer that reads every payload (the flight recorder), an
    # event's shapes, dtypes and nbytes are made when first read, or as the call
    # ends when an observer kept the event: the same values either way, and the
    # caller's tensor is not kept alive by a kept event
    keeper = _Keeper(read, at)
    others = [FlightRecorder(capacity=10)] if recorder else []
    for plugin in [keeper, *others]:
        plugin_manager().register(plugin)
    try:
        comm = Communicator()
        for call, _ in _PAYLOADS:
            call(comm)
        tensor = torch.ones(3)
        gone = weakref.ref(tensor)
        comm.all_reduce(tensor)
        del tensor
        gc.collect()
        assert gone() is None  # the kept event let the tensor go
    finally:
        for plugin in [keeper, *others]:
            plugin_manager().unregister(plugin)
    expected = [facts for _, facts in _PAYLOADS] + [(((3,),), ("float32",), 12)]
    got = [(e.shapes, e.dtypes, e.nbytes) for e in keeper.events]
    assert got == expected
    if read:  # what was read during the call is what is read after it
        assert keeper.values == [
            tuple(dict(zip(("shapes", "dtypes", "nbytes"), facts))[f] for f in read)
            for facts in expected
        ]
    for e in keeper.events:
        assert type(e).__name__ == "CollectiveEvent" and repr(e).startswith("CollectiveEvent(")


def test_an_event_is_a_collective_event_dataclass_whoever_observes():
    import dataclasses
    import pickle

    keeper = _Keeper()
    plugin_manager().register(keeper)
    try:
        Communicator().all_reduce(torch.ones(2, 2), op="max")
    finally:
        plugin_manager().unregister(keeper)
    (event,) = keeper.events
    assert isinstance(event, commlib.observe.CollectiveEvent)
    assert weakref.ref(event)() is event  # an observer may hold events weakly
    fields = dataclasses.asdict(dataclasses.replace(event, communicator=None))
    assert [f.name for f in dataclasses.fields(event)] == list(fields)
    assert fields["shapes"] == ((2, 2),) and fields["nbytes"] == 16 and fields["op"] == "max"
    assert fields["state"] == "completed" and fields["peers"] == {}
    copy = pickle.loads(pickle.dumps(dataclasses.replace(event, communicator=None)))
    assert type(copy) is commlib.observe.CollectiveEvent
    assert (copy.name, copy.seq, copy.shapes, copy.dtypes) == (
        "all_reduce",
        1,
        ((2, 2),),
        ("float32",),
    )


def test_flight_recorder_keeps_what_an_earlier_observer_set_and_events_made_elsewhere():
    class Renames:
        @hookimpl
        def commlib_collective_start(self, event):
            event.shapes = ((9, 9),)  # registered after the recorder: told first

    recorder = FlightRecorder(capacity=4)
    renames = Renames()
    plugin_manager().register(recorder)
    plugin_manager().register(renames)
    try:
        Communicator().all_reduce(torch.ones(2))
    finally:
        plugin_manager().unregister(renames)
        plugin_manager().unregister(recorder)
    # an event made outside the dispatcher, ending in failure, then one still running
    made = CollectiveEvent(None, "broadcast", 7, "world", (0,), 0, ((3,),), ("int64",), 24)
    made.peers, made.start = {"src": 0}, 10.0
    recorder.commlib_collective_start(made)
    made.duration, made.state, made.error = 2.0, "failed", RuntimeError("gone")
    recorder.commlib_collective_end(made)
    running = CollectiveEvent(None, "barrier", 8, "world", (0,), 0)
    recorder.commlib_collective_start(running)
    first, failed, still = recorder.snapshot()["entries"]
    assert first["name"] == "all_reduce" and first["shapes"] == [[9, 9]]
    assert first["state"] == "completed" and first["end"] >= first["start"]
    assert (failed["seq"], failed["shapes"], failed["dtypes"], failed["nbytes"]) == (
        7,
        [[3]],
        ["int64"],
        24,
    )
    assert failed["peers"] == {"src": 0} and failed["end"] == 12.0
    assert (failed["state"], failed["error"]) == ("failed", "RuntimeError: gone")
    assert (still["name"], still["state"], still["end"]) == ("barrier", "started", None)


class _EndRaising:
    """An observer with an end hook alone, which raises: the one-hook path disables it."""

    def __init__(self):
        self.ended = 0

    @hookimpl
    def commlib_collective_end(self, event):
        self.ended += 1
        raise RuntimeError("end hook bug")


def test_the_only_end_hook_that_raises_is_disabled_and_the_collective_goes_on():
    bad = _EndRaising()
    pm = plugin_manager()
    pm.register(bad, name="raising-end")
    try:
        comm = Communicator()
        x = torch.ones(2)
        with pytest.warns(RuntimeWarning, match="end hook bug"):
            comm.all_reduce(x)
        comm.all_reduce(x)  # disabled: not called again
        assert x.tolist() == [1.0, 1.0] and bad.ended == 1
        assert "raising-end" in dispatch.disabled()
    finally:
        pm.unregister(bad)
    assert dispatch.disabled() == {}


class _Reader:
    """An observer reading ``fields`` of every event at ``at``; it may keep each event too."""

    def __init__(self, fields: tuple[str, ...], at: str, keep: bool = False) -> None:
        self.fields, self.at, self.keep = fields, at, keep
        self.values: list[tuple] = []
        self.events: list = []

    def _read(self, event, when):
        if when == self.at:
            self.values.append(tuple(getattr(event, f) for f in self.fields))
        if self.keep and when == "end":
            self.events.append(event)

    @hookimpl
    def commlib_collective_start(self, event):
        self._read(event, "start")

    @hookimpl
    def commlib_collective_end(self, event):
        self._read(event, "end")


_EVERY_FIELD = (
    "name",
    "group_ranks",
    "rank",
    "shapes",
    "dtypes",
    "nbytes",
    "peers",
    "op",
    "async_op",
)


def _steady_then_changing(comm):
    """Steady calls, then the same collectives with other shapes, dtypes, ops and roots."""
    x = torch.ones(4)
    for _ in range(3):
        comm.all_reduce(x)
    comm.all_reduce(torch.ones(2, 3, dtype=torch.float64), "max")
    comm.all_reduce(x, op="min")
    comm.broadcast(torch.ones(5, dtype=torch.int32), src=0)
    comm.broadcast(tensor=torch.ones(1), src=0)
    comm.all_reduce(x)
    comm.barrier()


_EXPECTED = [
    ("all_reduce", (0,), 0, ((4,),), ("float32",), 16, {}, "sum", False),
] * 3 + [
    ("all_reduce", (0,), 0, ((2, 3),), ("float64",), 48, {}, "max", False),
    ("all_reduce", (0,), 0, ((4,),), ("float32",), 16, {}, "min", False),
    ("broadcast", (0,), 0, ((5,),), ("int32",), 20, {"src": 0}, None, False),
    ("broadcast", (0,), 0, ((1,),), ("float32",), 4, {"src": 0}, None, False),
    ("all_reduce", (0,), 0, ((4,),), ("float32",), 16, {}, "sum", False),
    ("barrier", (0,), 0, (), (), 0, {}, None, False),
]


@pytest.mark.parametrize("recorder", [False, True], ids=["lazy", "with_recorder"])
@pytest.mark.parametrize("at", ["start", "end", "after"])
def test_every_field_is_right_call_after_call_whenever_it_is_read(recorder, at):
    # without the flight recorder an event's fields are made from the call's
    # arguments when first read; with it its shared facts are one tuple kept per
    # shape and dtype: steady calls reuse what was made, and a call with other
    # shapes, dtypes, ops or roots still reads its own; an event kept after its
    # call reads the same later (nothing of a later call's lands in it)
    reader = _Reader(_EVERY_FIELD, at, keep=True)
    others = [FlightRecorder(capacity=20)] if recorder else []
    for plugin in [reader, *others]:
        plugin_manager().register(plugin)
    try:
        comm = Communicator()
        _steady_then_changing(comm)
    finally:
        for plugin in [reader, *others]:
            plugin_manager().unregister(plugin)
    after = [tuple(getattr(e, f) for f in _EVERY_FIELD) for e in reader.events]
    assert after == _EXPECTED
    if at != "after":
        assert reader.values == _EXPECTED
    assert len({id(e) for e in reader.events}) == len(_EXPECTED)  # one event a call
    assert len({e.group for e in reader.events}) == 1
    assert [e.seq for e in reader.events] == sorted(e.seq for e in reader.events)
    for e in reader.events:
        assert type(e).__name__ == "CollectiveEvent" and e.state == "completed"
        assert e.duration is not None and e.duration >= 0 and e.start > 0
    if recorder:
        entries = others[0].snapshot()["entries"]
        assert [(e["name"], e["shapes"], e["op"], e["peers"]) for e in entries] == [
            (n, [list(s) for s in shapes], op, peers)
            for n, _, _, shapes, _, _, peers, op, _ in _EXPECTED
        ]


def test_a_field_an_observer_writes_is_what_the_others_read_and_the_next_event_is_new():
    class Writes:
        @hookimpl
        def commlib_collective_start(self, event):
            event.op = "written"
            event.shapes = ((7,),)

    writes, reader = Writes(), _Reader(("op", "shapes", "nbytes", "name"), "end")
    for plugin in [reader, writes]:  # writes is told first
        plugin_manager().register(plugin)
    try:
        comm = Communicator()
        comm.all_reduce(torch.ones(3))
    finally:
        plugin_manager().unregister(writes)
    try:
        comm.all_reduce(torch.ones(3))
    finally:
        plugin_manager().unregister(reader)
    assert reader.values == [
        ("written", ((7,),), 12, "all_reduce"),
        ("sum", ((3,),), 12, "all_reduce"),
    ]


def test_a_kept_unread_event_lets_a_tensor_passed_by_keyword_go():
    keeper = _Keeper()
    plugin_manager().register(keeper)
    try:
        tensor = torch.ones(6)
        gone = weakref.ref(tensor)
        Communicator().broadcast(tensor=tensor, src=0)
        del tensor
        gc.collect()
        assert gone() is None
    finally:
        plugin_manager().unregister(keeper)
    (event,) = keeper.events
    assert (event.name, event.shapes, event.nbytes, event.peers) == (
        "broadcast",
        ((6,),),
        24,
        {"src": 0},
    )
    assert repr(event).startswith("CollectiveEvent(")


def test_a_list_s_payload_facts_follow_its_tensors_and_leave_other_things_out():
    import numpy as np

    tensors = [torch.ones(2), torch.ones(3, dtype=torch.int64)]
    assert payload_facts(tensors) == (((2,), (3,)), ("float32", "int64"), 32)
    tensors[1].resize_(5)  # the same tensors, another shape: facts made again
    assert payload_facts(tensors) == (((2,), (5,)), ("float32", "int64"), 48)
    assert payload_facts(tuple(tensors)) == (((2,), (5,)), ("float32", "int64"), 48)
    mixed = [torch.ones(2), np.ones(3, dtype=np.float32), "x"]
    assert payload_facts(mixed) == (((2,),), ("float32",), 8)
    assert payload_facts([torch.ones(2), np.ones(2, dtype=np.float32)]) == (
        ((2,),),
        ("float32",),
        8,
    )
