"""Stacks in one process: what is taken, where a rank is, the roll-call, damaged files."""

from __future__ import annotations

import json
import threading

import pytest

from commlib.observe import stacks, trace_files
from commlib.observe.diagnosis import diagnose


def _frame(file, line, function, kind="program", code=""):
    return [file, line, function, code, kind]


def test_capture_takes_every_thread_but_commlib_s_own_main_first():
    release = threading.Event()
    mine = threading.Thread(target=release.wait, name="worker", daemon=True)
    own = threading.Thread(target=release.wait, name="commlib-trace", daemon=True)
    mine.start()
    own.start()
    try:
        taken = stacks.capture("asked")
    finally:
        release.set()
    names = [t["name"] for t in taken["threads"]]
    assert names[0] == "MainThread" and "worker" in names and "commlib-trace" not in names
    main = taken["threads"][0]["frames"]
    assert main[-1][2] == "capture" and main[-1][4] == "commlib"
    assert any(
        f[2] == "test_capture_takes_every_thread_but_commlib_s_own_main_first" for f in main
    )


def test_where_is_the_innermost_frame_of_the_program_and_whether_in_a_collective():
    loop = [_frame("/job/train.py", 3, "main"), _frame("/job/eval.py", 52, "evaluate")]
    assert stacks.where([{"main": True, "frames": loop}]) == {
        "at": "eval.py:52 (evaluate)",
        "code": "",
        "in_collective": False,
    }
    waiting = [
        _frame("/job/train.py", 88, "step"),
        _frame("/x/commlib/observe/dispatch.py", 500, "wrapper", "commlib"),
        _frame("/usr/lib/python3.11/threading.py", 320, "wait", "library"),
    ]
    now = stacks.where([{"main": True, "frames": waiting}])
    assert now["at"] == "train.py:88 (step)" and now["in_collective"] is True


def test_the_roll_call_puts_ranks_with_one_stack_together_and_folds_commlib_s_frames():
    def waiting(depth):
        inside = [_frame("/x/commlib/m.py", i, "f", "commlib") for i in range(depth)]
        return {"threads": [{"name": "MainThread", "main": True, "frames": [
            _frame("/job/train.py", 88, "step", code="comm.all_reduce(grads)"), *inside
        ]}]}  # fmt: skip

    looping = {"threads": [{"name": "MainThread", "main": True, "frames": [
        _frame("/job/eval.py", 52, "evaluate", code="while True:")
    ]}]}  # fmt: skip
    lines = stacks.roll_call({0: waiting(9), 1: looping, 2: waiting(7)})
    assert lines == [
        "ranks 0, 2: MainThread",
        "    train.py:88 in step",
        "        comm.all_reduce(grads)",
        "    ... inside commlib",
        "rank 1: MainThread",
        "    eval.py:52 in evaluate",
        "        while True:",
    ]


def test_a_file_whose_stacks_are_damaged_is_unreadable_not_wrong(tmp_path):
    good = {"format": trace_files.FORMAT, "rank": 0, "entries": [], "stacks": None}
    trace_files.write(tmp_path, good)
    bad = dict(good, rank=1, stacks={"threads": "nope"})
    trace_files.path_for(tmp_path, 1).write_text(json.dumps(bad))
    found = diagnose(tmp_path)
    assert found["ranks_with_files"] == [0]
    assert found["unreadable"] and "stacks" in found["unreadable"][0]


@pytest.mark.parametrize("kind", ["program", "library"])
def test_kinds_are_judged_by_file(kind):
    file = "/job/train.py" if kind == "program" else threading.__file__
    assert stacks.kind_of(file) == kind
